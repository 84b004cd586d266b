"""The demo project's settings as a fresh ``startproject`` site has them: no LOGGING at all."""

from project.settings import *  # noqa: F403

del LOGGING  # noqa: F821 - defined by the star import; Django's default then applies
