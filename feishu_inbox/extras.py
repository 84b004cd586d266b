"""The optional pieces of the package and the extra that brings each (pyproject.toml).

A site installs only the extras it asks for; each piece is imported only where it is used, and
a site that uses one without its extra is told which extra to install (a system check, or the
command that needs it stopping at once), never a traceback or a retry loop.

A leaf: this module imports nothing of the package but its errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec

from .errors import ConfigurationError


@dataclass(frozen=True)
class Extra:
    name: str  # the extra: pip install "feishu-inbox[<name>]"
    requirement: str  # what the extra installs
    modules: tuple[str, ...]  # what is imported: any one of them will do

    @property
    def pip(self) -> str:
        return f'pip install "feishu-inbox[{self.name}]" (or: pip install {self.requirement})'


EXTRAS = {
    extra.name: extra
    for extra in (
        Extra("postgres", "psycopg[binary]", ("psycopg",)),
        Extra("openapi", "lark-oapi", ("lark_oapi",)),
        Extra("connect", "websockets", ("websockets",)),
        Extra("metrics", "prometheus-client", ("prometheus_client",)),
        Extra("traces", "opentelemetry-api", ("opentelemetry.trace",)),
        # Django 6 has the tasks framework; the extra is its backport, for Django 5.2.
        Extra("tasks", "django-tasks", ("django.tasks", "django_tasks")),
    )
}


def installed(name: str) -> bool:
    """Whether the extra's module can be imported (without importing it)."""
    return any(_found(module) for module in EXTRAS[name].modules)


def _found(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is missing
        return False


def require(name: str, what: str) -> None:
    """Raise ``ConfigurationError`` (code, what, the pip line) when the extra is missing."""
    if installed(name):
        return
    extra = EXTRAS[name]
    raise ConfigurationError(
        f"{what} needs {extra.requirement} (the {extra.name} extra), which is not installed.",
        fix=f"{extra.pip}, then start it again.",
    )
