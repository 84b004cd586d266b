"""System checks with stable ids: misconfiguration is caught at start-up, with the fix."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register
from django.db import connections

from .conf import APP_KEYS, inbox_settings, unknown_keys
from .errors import ConfigurationError
from .extras import EXTRAS, installed
from .store import store_for


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        conf = inbox_settings()
    except (ConfigurationError, TypeError) as exc:
        return [
            Error(
                f"settings.FEISHU_INBOX is invalid: {exc}",
                hint="FEISHU_INBOX is a dict of the keys listed in docs/configuration.md.",
                id="feishu_inbox.E001",
            )
        ]
    messages: list[CheckMessage] = [
        Error(
            problem,
            hint="Fix settings.FEISHU_INBOX (see docs/configuration.md).",
            id="feishu_inbox.E002",
        )
        for problem in conf.validate()
    ]
    for key in unknown_keys():
        messages.append(
            Warning(
                f"settings.FEISHU_INBOX has an unknown key {key!r}; it is ignored.",
                hint="Check its spelling against docs/configuration.md.",
                id="feishu_inbox.W001",
            )
        )
    return messages


@register(Tags.compatibility)  # reads settings only: runs without --database
def check_database_options(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A web process and a worker share the database safely only with some options (SQLite)."""
    default = connections["default"]
    found = store_for(default.vendor)
    problems = found.settings_problems(default.settings_dict) if found else []
    if not problems:
        return []
    return [
        Warning(
            f"The {default.display_name} database is not set up for a web process and a "
            "worker at once; expect 'database is locked' errors.",
            hint="Set " + ", ".join(problems) + " in DATABASES['default'].",
            id="feishu_inbox.W002",
        )
    ]


@register(Tags.compatibility)  # reads settings only
def check_pooler(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Behind a pooler in transaction mode nothing may rely on a server session lasting past
    one transaction: no prepared statements of psycopg's, no server-side cursors, no LISTEN
    through the pooler (docs/production.md, "PostgreSQL topology")."""
    default = connections["default"]
    try:
        conf = inbox_settings()
    except (ConfigurationError, TypeError):
        return []  # reported by check_settings
    found = store_for(default.vendor)
    if found is None or not found.server_sessions or not conf.TRANSACTION_POOLER:
        return []
    messages: list[CheckMessage] = []
    options = default.settings_dict.get("OPTIONS", {})
    if options.get("prepare_threshold") is not None:
        messages.append(
            Error(
                "TRANSACTION_POOLER is set, and psycopg prepares statements on the server "
                f"(OPTIONS['prepare_threshold'] = {options['prepare_threshold']!r}): the "
                "pooler runs the next use on another session, where the statement does not "
                "exist (PgBouncer before 1.21).",
                hint="Remove OPTIONS['prepare_threshold'] (Django's default, None, prepares "
                "nothing), or upgrade PgBouncer to 1.21+ with max_prepared_statements set and "
                "unset TRANSACTION_POOLER.",
                id="feishu_inbox.E009",
            )
        )
    if not default.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        messages.append(
            Error(
                "TRANSACTION_POOLER is set, but Django's server-side cursors are on: a "
                "queryset's .iterator() opens a cursor in one transaction that the pooler may "
                "look for in another session.",
                hint="Set DISABLE_SERVER_SIDE_CURSORS = True in DATABASES['default'].",
                id="feishu_inbox.E009",
            )
        )
    if not (conf.LISTEN_URL or conf.POLL_ONLY):
        messages.append(
            Warning(
                "TRANSACTION_POOLER is set without LISTEN_URL: a LISTEN through the pooler "
                "hears nothing, so workers poll every POLL_INTERVAL "
                f"({conf.POLL_INTERVAL:g}s): an idle worker starts a new event up to that "
                "late.",
                hint="Set FEISHU_INBOX['LISTEN_URL'] to a direct connection to the same "
                "database (wake-ups in milliseconds), or POLL_ONLY = True to choose polling.",
                id="feishu_inbox.W009",
            )
        )
    return messages


@register(Tags.compatibility, deploy=True)
def check_wakeups(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``check --deploy`` says how the workers of a site that chose its PostgreSQL topology
    (a pooler, LISTEN_URL, POLL_ONLY) learn of new events, and what that costs an event that
    arrives while they are idle. The default (LISTEN on the database) says nothing."""
    try:
        conf = inbox_settings()
    except (ConfigurationError, TypeError):
        return []
    default = connections["default"]
    chosen = conf.TRANSACTION_POOLER or conf.POLL_ONLY or bool(conf.LISTEN_URL)
    found = store_for(default.vendor)
    if found is None or not found.server_sessions or not chosen:
        return []
    if conf.POLL_ONLY or (conf.TRANSACTION_POOLER and not conf.LISTEN_URL):
        how = (
            f"poll-only: workers look at the ledger every POLL_INTERVAL ({conf.POLL_INTERVAL:g}s"
            "), so a new event waits up to that long (half on average) for an idle worker, "
            "and each idle worker costs the database one claim per interval"
        )
    else:
        where = "LISTEN_URL (direct)" if conf.LISTEN_URL else "DATABASES['default']"
        pooled = " behind the pooler" if conf.TRANSACTION_POOLER else ""
        how = (
            f"LISTEN on {where}{pooled}: an idle worker is woken by NOTIFY within "
            "milliseconds of a commit, one extra connection per worker process; until a "
            f"probe shows notices arrive, it polls every {conf.POLL_INTERVAL:g}s"
        )
    return [Info(f"Wake-ups: {how}.", id="feishu_inbox.I001")]


@register(Tags.security)
def check_app_secrets(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        apps = inbox_settings().APPS
    except (ConfigurationError, TypeError):
        return []  # reported by check_settings
    if not apps:
        return [
            Warning(
                "No Feishu app is configured: the webhook refuses every delivery (404).",
                hint='Set FEISHU_INBOX["APPS"] = {"default": {"ENCRYPT_KEY": ..., '
                '"VERIFICATION_TOKEN": ...}}.',
                id="feishu_inbox.W003",
            )
        ]
    return [
        Warning(
            f"Feishu app {name!r} has neither an Encrypt Key nor a Verification Token: anyone "
            "who finds the URL can store events.",
            hint="Copy both from the app's Event Subscriptions page in the Feishu console "
            "(an app that receives over the long connection needs them too: its webhook URL "
            "is served all the same).",
            id="feishu_inbox.W003",
        )
        for name, secrets in apps.items()
        if isinstance(secrets, dict)
        and not (secrets.get("ENCRYPT_KEY") or secrets.get("VERIFICATION_TOKEN"))
    ]


@register(Tags.security)
def check_openapi_credentials(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """An app that replies through the Open API needs APP_ID and APP_SECRET, and the SDK."""
    try:
        apps = inbox_settings().APPS
    except (ConfigurationError, TypeError):
        return []  # reported by check_settings
    messages: list[CheckMessage] = []
    replying = []
    for name, secrets in apps.items() if isinstance(apps, dict) else ():
        if not isinstance(secrets, dict):
            continue  # reported by check_settings
        unknown = sorted(str(key) for key in secrets if key not in APP_KEYS)
        if unknown:
            messages.append(
                Warning(
                    f"Feishu app {name!r} has unknown keys {', '.join(unknown)}; they are ignored.",
                    hint="Check their spelling: an app's keys are " + ", ".join(APP_KEYS) + ".",
                    id="feishu_inbox.W007",
                )
            )
        has_id, has_secret = bool(secrets.get("APP_ID")), bool(secrets.get("APP_SECRET"))
        if has_id != has_secret:
            present, missing = ("APP_ID", "APP_SECRET") if has_id else ("APP_SECRET", "APP_ID")
            messages.append(
                Warning(
                    f"Feishu app {name!r} has an {present} but no {missing}: it cannot reply "
                    "or send through the Open API.",
                    hint="Copy both from the app's Credentials page in the Feishu console.",
                    id="feishu_inbox.W006",
                )
            )
        elif has_id:
            replying.append(name)
    # A warning, not an error: the long connection needs the same credentials and not the
    # SDK, so a site that only receives over it installs the connect extra alone; a reply or
    # send without the SDK fails its job at once, naming the extra.
    if replying and not installed("openapi"):
        messages.append(
            Warning(
                "Open API credentials are set for Feishu app "
                f"{', '.join(map(repr, replying))}, but Feishu's SDK (lark-oapi) is not "
                "installed: replies and sends would fail (the long connection needs no SDK).",
                hint=EXTRAS["openapi"].pip + ".",
                id="feishu_inbox.W008",
            )
        )
    return messages


@register()
def check_handlers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from .runtime.registry import problems, registered

    messages: list[CheckMessage] = [
        Error(problem, hint=_handler_hint(problem), id="feishu_inbox.E003")
        for problem in problems()
    ]
    if not registered():
        messages.append(
            Warning(
                "No handler is registered: every stored event will complete as NoHandler.",
                hint="Put @feishu_inbox.handler functions in a feishu_handlers.py module of an "
                "installed app, or list their module in FEISHU_INBOX['HANDLER_MODULES']; "
                "`manage.py inbox replay --error NoHandler` runs those stored meanwhile.",
                id="feishu_inbox.W004",
            )
        )
    return messages


@register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from .schedules import problems

    return [
        Error(
            problem,
            hint="Fix the declaration (@feishu_inbox.schedule or FEISHU_INBOX['SCHEDULES']); "
            "see docs/schedules.md.",
            id="feishu_inbox.E004",
        )
        for problem in problems()
    ]


@register()
def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Task backends that are the ledger (tasks/): their queue names must fit its partition
    keys. Read from settings.TASKS, so the check runs whether or not anything imported the
    tasks framework (Django 6 registers its own backend checks only once it is imported)."""
    from .tasks import BACKEND, bad_queue_names

    messages: list[CheckMessage] = []
    for alias, params in sorted(getattr(settings, "TASKS", {}).items()):
        if params.get("BACKEND") != BACKEND:
            continue
        if not installed("tasks"):
            messages.append(
                Error(
                    f"Task backend {alias!r} is feishu_inbox.tasks.LedgerBackend, but neither "
                    "django.tasks (Django 6) nor the django-tasks backport is installed.",
                    hint=EXTRAS["tasks"].pip + ", or upgrade to Django 6.",
                    id="feishu_inbox.E008",
                )
            )
        bad = bad_queue_names(params.get("QUEUES") or ["default"])
        if bad:
            messages.append(
                Error(
                    f"Task backend {alias!r} has queue names the ledger cannot store: "
                    f"{', '.join(map(repr, bad))}.",
                    hint="Name each queue with 1 to 64 characters, without ':'.",
                    id="feishu_inbox.E007",
                )
            )
    return messages


def _handler_hint(problem: str) -> str:
    """The fix for one handler problem (``registry.problems``)."""
    if "cannot be imported" in problem:
        return (
            "Create that module (e.g. mysite/feishu_handlers.py beside settings.py) or correct "
            "its dotted path in FEISHU_INBOX['HANDLER_MODULES']: it must import from the "
            "Python path the site runs with."
        )
    if " handlers for " in problem:
        return "Register exactly one callable per event type: remove or rename the others."
    return "Register a function (or an object with __call__) for that event type."
