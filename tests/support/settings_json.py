"""The demo settings, with FEISHU_INBOX keys replaced from the FEISHU_INBOX_JSON environment
variable (a JSON object): how a test gives a subprocess apps, timeouts and intervals.
``DEMO_APP=0`` leaves the demo app (and its handlers) out, for a test's own handlers."""

from __future__ import annotations

import json
import os

from project.settings import *  # noqa: F403
from project.settings import FEISHU_INBOX as _DEMO
from project.settings import INSTALLED_APPS as _APPS

FEISHU_INBOX = {**_DEMO, **json.loads(os.environ.get("FEISHU_INBOX_JSON") or "{}")}
if os.environ.get("DEMO_APP") == "0":
    INSTALLED_APPS = [app for app in _APPS if app != "project.demo"]
