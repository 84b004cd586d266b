"""Settings of feishu_inbox, read lazily from ``settings.FEISHU_INBOX`` (a dict).

Reading at use time (not import time) keeps ``override_settings`` working in tests. Invalid
values are reported by the system checks in ``checks.py`` (``python manage.py check``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from .errors import ConfigurationError


@dataclass(frozen=True)
class InboxSettings:
    #: Attempts before a job that fails (before any effect) becomes ``failed``.
    MAX_ATTEMPTS: int = 5
    #: Backoff before retry n is ``min(BACKOFF_CAP, BACKOFF_BASE * 2**(n-1))`` seconds, then
    #: reduced by up to ``BACKOFF_JITTER`` (a fraction) at random, so failures spread out.
    BACKOFF_BASE: float = 5.0
    BACKOFF_CAP: float = 3600.0
    BACKOFF_JITTER: float = 0.5
    #: Lease a worker holds on a claimed job; it renews every third of it.
    LEASE_SECONDS: float = 60.0
    #: How long ``completed`` jobs are kept (dedupe window). Feishu redelivers for ~7 hours;
    #: less than a day is refused.
    COMPLETED_RETENTION: timedelta = timedelta(days=7)
    #: How long ``unknown`` jobs are kept; ``None`` = until an operator reconciles them.
    UNKNOWN_RETENTION: timedelta | None = None
    #: How long a signal sent before its waiter waits is kept for it (``feishu_inbox.signal``).
    SIGNAL_KEEP: timedelta = timedelta(days=1)
    #: Let a newer private (p2p) message supersede the running one at its checkpoint.
    INTERRUPT_PRIVATE: bool = True
    #: Rows deleted per purge transaction (purging never holds long locks).
    PURGE_BATCH_SIZE: int = 1000
    #: Workers purge by themselves, one at a time, at most this often (seconds); ``None``
    #: leaves retention to ``manage.py inbox purge`` run from cron.
    PURGE_INTERVAL: float | None = 300.0
    #: Each worker writes its heartbeat row this often (seconds); it is lost after three
    #: intervals without one, and a lost or stopped worker's row is deleted after
    #: WORKER_RETENTION (a timedelta).
    WORKER_BEAT_SECONDS: float = 5.0
    WORKER_RETENTION: timedelta = timedelta(hours=1)
    #: PostgreSQL: prepare the statements sent for every job (enqueue, claim, end of attempt)
    #: on the server, so each connection parses and plans them once. Set False behind a
    #: connection pooler that cannot keep prepared statements (PgBouncer before 1.21 in
    #: transaction mode, or with max_prepared_statements = 0).
    PREPARE_STATEMENTS: bool = True
    #: A worker's slots that finish while one of its finishes is being written send theirs
    #: together, in one statement and one commit (group commit). Off by default: the batch's
    #: finishes and claims then run one after another in one database session, so a worker
    #: uses one core of the database at most; written each on its own slot's connection they
    #: run in parallel, and PostgreSQL still shares the WAL flush of commits that coincide
    #: (bench/worker.py, 1 process x 4 slots: 930 jobs/s together, 1,317 apart). Turn it on
    #: when the database's CPU, not its latency, is what limits the workers.
    FINISH_TOGETHER: bool = False
    #: A worker writes the finishes of its slots that end within this window (seconds)
    #: together, with its next claims, in one statement and one commit, and holds a small
    #: buffer of claimed jobs for its fast handlers (runtime/batching.py): a finish waits at
    #: most this long behind another job. 0 turns batches off: each slot writes its own
    #: finish and claims its own next job (FINISH_TOGETHER then applies).
    BATCH_WINDOW: float = 0.005
    #: Most finishes in one batch, and most jobs a worker holds in its buffer.
    BATCH_SIZE: int = 32
    #: Longest a worker sleeps between looks at the ledger when no wake-up is pushed to it
    #: (SQLite, POLL_ONLY, or a LISTEN whose notices do not arrive).
    POLL_INTERVAL: float = 1.0
    #: PostgreSQL: DATABASES["default"] goes through a pooler in transaction mode (PgBouncer
    #: ``pool_mode = transaction``): consecutive transactions of one Django connection may run
    #: on different server sessions. The hot statements are then never prepared on the server
    #: (whatever PREPARE_STATEMENTS says), and a worker takes its wake-ups from LISTEN_URL, or
    #: polls (POLL_ONLY): a LISTEN through the pooler hears nothing. docs/production.md,
    #: "PostgreSQL topology".
    TRANSACTION_POOLER: bool = False
    #: PostgreSQL: a libpq connection string or URL of the same database reached directly (not
    #: through the pooler) on which each worker LISTENs for wake-ups; it may name several hosts
    #: (``host=a,b target_session_attrs=read-write``). Empty: DATABASES["default"]'s own.
    LISTEN_URL: str = ""
    #: PostgreSQL: no LISTEN at all; an idle worker looks at the ledger every POLL_INTERVAL
    #: (a new job waits up to that long). For a site that can reach its database only
    #: through a transaction pooler.
    POLL_ONLY: bool = False
    #: Dotted paths of handler modules to import besides the autodiscovered ``feishu_handlers``.
    HANDLER_MODULES: tuple[str, ...] | list[str] = ()
    #: Feishu apps this site receives events for: name -> {"ENCRYPT_KEY", "VERIFICATION_TOKEN"}.
    #: No ENCRYPT_KEY means plaintext mode (token check only). An app that replies through the
    #: Open API also has "APP_ID", "APP_SECRET" and optionally "DOMAIN" (see ``APP_KEYS``).
    APPS: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Tenants (SPEC §9j, docs/tenants.md): refuse a job that declares no tenant
    #: (``job_tenant_required``; ``tenant=""`` declares "none" explicitly).
    TENANT_REQUIRED: bool = False
    #: The per-tenant gauges name this many tenants, those with the largest backlog; the rest
    #: are summed under tenant "other" (a bounded label set however many tenants there are).
    TENANT_METRICS_TOP: int = 10
    #: A store app's tokens (app_access_token, each tenant's tenant_access_token) are fetched
    #: anew when less than this many seconds of them are left (Feishu answers a new one then).
    STORE_TOKEN_MARGIN_SECONDS: float = 600.0
    #: Largest request body the webhook reads (413 above).
    MAX_BODY_BYTES: int = 1024 * 1024
    #: Signed requests whose timestamp is further than this from now are refused (401);
    #: ``None`` turns the check off. Replays inside the window are deduplicated.
    REPLAY_WINDOW_SECONDS: float | None = 300.0
    #: Time a card action callback may take before the webhook answers ``{}`` without it.
    CARD_CALLBACK_BUDGET_SECONDS: float = 2.5
    #: The long connection (``manage.py feishu_connect``): time from receiving an event to its
    #: ACK, the store included. Feishu redelivers what is not ACKed with code 200 within 3 s,
    #: so a store that takes longer (a locked or absent database) gets no success ACK.
    ACK_BUDGET_SECONDS: float = 2.5
    #: The long connection pings at this interval at most (Feishu's PingInterval, 120 s by
    #: default, only when shorter), and replaces a connection whose pong takes longer than
    #: PONG_TIMEOUT_SECONDS: a silent server is noticed within the sum of the two.
    PING_SECONDS: float = 10.0
    PONG_TIMEOUT_SECONDS: float = 5.0
    #: A lost connection is opened again after RECONNECT_MIN_SECONDS, doubling (with jitter)
    #: after each failed try up to RECONNECT_MAX_SECONDS; it never gives up.
    RECONNECT_MIN_SECONDS: float = 1.0
    RECONNECT_MAX_SECONDS: float = 60.0
    #: Time allowed to each HTTP call and each WebSocket handshake of the long connection.
    CONNECT_TIMEOUT_SECONDS: float = 10.0
    #: Feishu's message limits, kept by the ledger for ``reply``/``send`` (requests per second
    #: for each chat, each user a message goes to, and each app); None turns one off. Lower
    #: them when other systems send as the same app; raise them for a tenant with a higher
    #: quota.
    FEISHU_RATE_LIMITS: dict[str, float | None] = field(
        default_factory=lambda: {"chat": 5.0, "user": 5.0, "app": 50.0}
    )
    #: Who may read the web process's ``metrics/`` view besides staff users: a bearer token
    #: (``Authorization: Bearer <token>``; empty: none) and client networks ("10.0.0.0/8",
    #: "127.0.0.1"). With neither, only a logged-in staff user may.
    METRICS_TOKEN: str = ""
    METRICS_ALLOW: list[str] = field(default_factory=list)
    #: Schedules whose target is named by dotted path: name -> {"cron", "handler", "tz",
    #: "catch_up", "max_catch_up", "partition"}; checked by ``schedules`` (E004).
    SCHEDULES: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Outbound webhooks (docs/webhooks.md). One request's whole time (connect, send, read
    #: the answer): past it the request is dropped and retried under the same webhook-id.
    WEBHOOK_TIMEOUT_SECONDS: float = 15.0
    #: Seconds before each retry of a delivery that got no answer, a 408/409/425/429 or a
    #: 5xx (Svix's: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h); the last one repeats until the
    #: endpoint succeeds or is disabled. A Retry-After the receiver sends wins when longer.
    WEBHOOK_RETRY_SCHEDULE: tuple[float, ...] | list[float] = (
        5,
        300,
        1800,
        7200,
        18000,
        36000,
        36000,
    )
    #: An endpoint whose every attempt failed for this long is disabled (its deliveries held).
    WEBHOOK_DISABLE_AFTER: timedelta = timedelta(days=5)
    #: After ``rotate_secret`` the old secret signs too (a second signature) for this long.
    WEBHOOK_ROTATION_GRACE: timedelta = timedelta(hours=24)
    #: Let endpoints reach private, loopback and link-local addresses (a site that sends to
    #: its own network on purpose); off, such a URL is refused and never connected to.
    WEBHOOK_ALLOW_PRIVATE: bool = False
    #: The event types the site publishes; when set, ``publish`` and ``add_endpoint`` refuse
    #: any other (``webhook_event_unknown``). Empty: any type of 1 to 128 characters.
    WEBHOOK_EVENT_TYPES: tuple[str, ...] | list[str] = ()
    #: Backfills and exports (docs/backfills.md, docs/exports.md). The environment these
    #: settings are for ("production", "staging"…; "" unmarked): a backfill is refused
    #: (``backfill_environment``) when its declaration names other environments, or when it
    #: was started in this database under another one.
    ENVIRONMENT: str = ""
    #: A running backfill with no batch committed for this long is stalled (its declaration
    #: may say otherwise).
    BACKFILL_STALL_SECONDS: float = 600.0
    #: A part of an export bigger than this fails the export (``export_part_too_large``).
    EXPORT_MAX_PART_BYTES: int = 1024**3
    #: Exports finished longer ago than this are removed, files and rows, by the workers.
    EXPORT_RETENTION: timedelta = timedelta(days=7)
    #: The folder of the storage exports are written under.
    EXPORT_PREFIX: str = "feishu_inbox/exports"
    #: How long an export's download link (in admin) works.
    EXPORT_LINK_SECONDS: float = 3600.0

    def validate(self) -> list[str]:
        """Every problem with these values, as sentences (empty when valid)."""
        problems = []
        if self.MAX_ATTEMPTS < 1:
            problems.append(f"MAX_ATTEMPTS must be at least 1 (got {self.MAX_ATTEMPTS}).")
        if self.BACKOFF_BASE <= 0 or self.BACKOFF_CAP < self.BACKOFF_BASE:
            problems.append(
                "BACKOFF_BASE must be > 0 and BACKOFF_CAP >= BACKOFF_BASE "
                f"(got {self.BACKOFF_BASE}, {self.BACKOFF_CAP})."
            )
        if not 0 <= self.BACKOFF_JITTER <= 1:
            problems.append(f"BACKOFF_JITTER must be within 0..1 (got {self.BACKOFF_JITTER}).")
        if self.LEASE_SECONDS < 1:
            problems.append(f"LEASE_SECONDS must be at least 1 (got {self.LEASE_SECONDS}).")
        if timedelta(days=1) > self.COMPLETED_RETENTION:
            problems.append(
                "COMPLETED_RETENTION must be at least 1 day: Feishu redelivers events for "
                "hours, and a purged job would run again "
                f"(got {self.COMPLETED_RETENTION})."
            )
        if self.UNKNOWN_RETENTION is not None and self.INTERRUPT_PRIVATE:
            problems.append(
                "INTERRUPT_PRIVATE requires UNKNOWN_RETENTION = None: an interrupted job "
                "may end `unknown`, and an expiring unknown job would silently drop an "
                "effect nobody reconciled."
            )
        if not isinstance(self.SIGNAL_KEEP, timedelta) or self.SIGNAL_KEEP.total_seconds() <= 0:
            problems.append(f"SIGNAL_KEEP must be a positive duration (got {self.SIGNAL_KEEP}).")
        if self.PURGE_BATCH_SIZE < 1:
            problems.append(f"PURGE_BATCH_SIZE must be at least 1 (got {self.PURGE_BATCH_SIZE}).")
        if not 0 <= self.TENANT_METRICS_TOP <= 100:
            problems.append(
                f"TENANT_METRICS_TOP must be within 0..100 (got {self.TENANT_METRICS_TOP})."
            )
        if not 0 <= self.STORE_TOKEN_MARGIN_SECONDS < 1800:
            problems.append(
                "STORE_TOKEN_MARGIN_SECONDS must be within 0..1800 "
                f"(got {self.STORE_TOKEN_MARGIN_SECONDS}): Feishu hands out a new token only "
                "in the last 30 minutes of the old one's 2 hours, so a larger margin would "
                "fetch the same token again on every call until then."
            )
        if self.PURGE_INTERVAL is not None and self.PURGE_INTERVAL < 1:
            problems.append(
                "PURGE_INTERVAL must be at least 1 second, or None to purge from cron only "
                f"(got {self.PURGE_INTERVAL})."
            )
        if not isinstance(self.APPS, dict) or not all(
            isinstance(v, dict) for v in self.APPS.values()
        ):
            problems.append(
                'APPS must map app names to dicts like {"ENCRYPT_KEY": ..., '
                '"VERIFICATION_TOKEN": ...}.'
            )
        else:
            problems.extend(app_problems(self.APPS))
        if self.MAX_BODY_BYTES < 1024:
            problems.append(f"MAX_BODY_BYTES must be at least 1024 (got {self.MAX_BODY_BYTES}).")
        window = self.REPLAY_WINDOW_SECONDS
        if window is not None and not (0 < window < self.COMPLETED_RETENTION.total_seconds()):
            problems.append(
                "REPLAY_WINDOW_SECONDS must be > 0 and shorter than COMPLETED_RETENTION, so "
                f"every replay it accepts is deduplicated (got {window})."
            )
        if not 0 < self.ACK_BUDGET_SECONDS < 3:
            problems.append(
                "ACK_BUDGET_SECONDS must be > 0 and under 3: Feishu redelivers an event whose "
                f"ACK takes 3 seconds or more (got {self.ACK_BUDGET_SECONDS})."
            )
        for name in ("PING_SECONDS", "PONG_TIMEOUT_SECONDS", "CONNECT_TIMEOUT_SECONDS"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0 (got {getattr(self, name)}).")
        if not 0 < self.RECONNECT_MIN_SECONDS <= self.RECONNECT_MAX_SECONDS:
            problems.append(
                "RECONNECT_MIN_SECONDS must be > 0 and RECONNECT_MAX_SECONDS at least as long "
                f"(got {self.RECONNECT_MIN_SECONDS}, {self.RECONNECT_MAX_SECONDS})."
            )
        limits = self.FEISHU_RATE_LIMITS
        if not isinstance(limits, dict) or not set(limits) <= {"chat", "user", "app"}:
            problems.append(
                'FEISHU_RATE_LIMITS must be a dict with keys among "chat", "user" and "app" '
                f"(got {limits!r})."
            )
        else:
            for name, rate in limits.items():
                if rate is not None and (
                    isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0
                ):
                    problems.append(
                        f"FEISHU_RATE_LIMITS[{name!r}] must be a number of requests per second "
                        f"> 0, or None for no limit (got {rate!r})."
                    )
        beat = self.WORKER_BEAT_SECONDS
        if isinstance(beat, bool) or not isinstance(beat, int | float) or not beat > 0:
            problems.append(f"WORKER_BEAT_SECONDS must be > 0 (got {beat!r}).")
        kept = self.WORKER_RETENTION
        if not isinstance(kept, timedelta) or kept.total_seconds() <= 0:
            problems.append(
                f"WORKER_RETENTION must be a positive timedelta (got {self.WORKER_RETENTION!r})."
            )
        window = self.BATCH_WINDOW
        if isinstance(window, bool) or not isinstance(window, int | float) or not 0 <= window <= 1:
            problems.append(
                f"BATCH_WINDOW must be a number of seconds from 0 (no batches) to 1 "
                f"(got {window!r}); a few milliseconds is what it is for."
            )
        size = self.BATCH_SIZE
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 1000:
            problems.append(f"BATCH_SIZE must be an integer from 1 to 1000 (got {size!r}).")
        if self.POLL_INTERVAL <= 0:
            problems.append(f"POLL_INTERVAL must be > 0 (got {self.POLL_INTERVAL}).")
        if not isinstance(self.LISTEN_URL, str):
            problems.append(
                "LISTEN_URL must be a string: a connection string or postgres:// URL of the "
                f"database reached directly (got {type(self.LISTEN_URL).__name__})."
            )
        elif self.LISTEN_URL and self.POLL_ONLY:
            problems.append(
                "LISTEN_URL and POLL_ONLY are both set: a worker either LISTENs on LISTEN_URL "
                "or polls; unset one."
            )
        if not isinstance(self.METRICS_TOKEN, str):
            problems.append("METRICS_TOKEN must be a string (a bearer token; empty: none).")
        elif self.METRICS_TOKEN and len(self.METRICS_TOKEN) < 16:
            problems.append(
                f"METRICS_TOKEN is {len(self.METRICS_TOKEN)} characters; use at least 16 "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')."
            )
        problems += metrics_allow_problems(self.METRICS_ALLOW)
        problems += webhook_problems(self)
        problems += backfill_problems(self)
        return problems


_FIELDS = {f.name for f in fields(InboxSettings)}

#: The keys of one app in APPS. The webhook reads the first two; the Open API client
#: (``feishu/openapi.py``) the last three: DOMAIN is "feishu" (the default), "lark", or the
#: base URL of a private deployment or a local test server.
APP_KEYS = ("ENCRYPT_KEY", "VERIFICATION_TOKEN", "APP_ID", "APP_SECRET", "DOMAIN", "APP_TYPE")
#: APP_TYPE: "self_built" (the default: one tenant, ``tenant_access_token/internal``) or
#: "store" (a store, ISV, app: ``feishu/tenancy.py`` keeps its ticket and tokens).
APP_TYPES = ("self_built", "store")
#: Where each DOMAIN name sends Open API calls (the values of lark_oapi.FEISHU_DOMAIN and
#: LARK_DOMAIN, repeated here so that reading settings never imports the SDK).
OPENAPI_DOMAINS = {"feishu": "https://open.feishu.cn", "lark": "https://open.larksuite.com"}
#: Plain http is allowed only to these hosts (the SDK refuses it elsewhere: the requests carry
#: the app secret and the tenant token).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def openapi_base_url(domain: str) -> str:
    """The Open API origin an app's DOMAIN names; ConfigurationError saying why if none."""
    named = OPENAPI_DOMAINS.get(domain.strip().lower())
    if named:
        return named
    url = domain.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        host, _ = (parts.hostname or "").lower(), parts.port  # .port checks the port
    except ValueError as exc:
        raise ConfigurationError(f"DOMAIN {domain!r} is not a URL ({exc}).") from None
    why = ""
    if parts.scheme not in ("https", "http") or not host:
        why = 'it must be "feishu", "lark" or a base URL like https://open.example.com'
    elif parts.scheme == "http" and host not in LOOPBACK_HOSTS:
        why = "plain http is allowed only to 127.0.0.1, localhost or ::1; use https"
    elif "@" in parts.netloc or parts.path or parts.query or parts.fragment:
        why = "a base URL is scheme://host[:port] only, without a path, query or credentials"
    if why:
        raise ConfigurationError(f"DOMAIN {domain!r} is not valid: {why}.")
    return url


def app_problems(apps: dict[str, dict[str, Any]]) -> list[str]:
    """Every invalid value among the apps' keys, as sentences (a key set in one app but not
    its partner is a warning, ``feishu_inbox.W006``, not a problem here)."""
    problems = []
    for name, secrets in apps.items():
        for key in APP_KEYS:
            value = secrets.get(key)
            if value is not None and not isinstance(value, str):
                problems.append(
                    f"APPS[{name!r}][{key!r}] must be a string (got {type(value).__name__})."
                )
        app_type = secrets.get("APP_TYPE")
        if isinstance(app_type, str) and app_type not in APP_TYPES:
            problems.append(f"APPS[{name!r}]['APP_TYPE'] must be one of {', '.join(APP_TYPES)}.")
        domain = secrets.get("DOMAIN")
        if isinstance(domain, str) and domain:
            try:
                openapi_base_url(domain)
            except ConfigurationError as exc:
                problems.append(f"APPS[{name!r}]: {exc.message}")
    return problems


def raw_settings() -> dict[str, Any]:
    value = getattr(settings, "FEISHU_INBOX", {}) or {}
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"settings.FEISHU_INBOX must be a dict, not {type(value).__name__}."
        )
    return value


def unknown_keys() -> list[str]:
    return sorted(k for k in raw_settings() if k not in _FIELDS)


_DURATIONS = (
    "COMPLETED_RETENTION",
    "UNKNOWN_RETENTION",
    "WORKER_RETENTION",
    "SIGNAL_KEEP",
    "WEBHOOK_DISABLE_AFTER",
    "WEBHOOK_ROTATION_GRACE",
    "EXPORT_RETENTION",
)


def _coerce(name: str, value: Any) -> Any:
    if name in _DURATIONS and isinstance(value, int | float):
        return timedelta(seconds=value)
    return value


def inbox_settings() -> InboxSettings:
    """The current settings (unknown keys are reported by the system check, not here)."""
    raw = raw_settings()
    return InboxSettings(**{k: _coerce(k, v) for k, v in raw.items() if k in _FIELDS})


_checked: list[Any] = [None, None]  # [the FEISHU_INBOX object, its validated settings]


def checked_settings() -> InboxSettings:
    """The current settings, or ConfigurationError listing every problem.

    Validated once per settings object: ``override_settings`` (and a new dict) are seen at
    once; mutating the dict in place after first use is not supported.
    """
    raw = getattr(settings, "FEISHU_INBOX", None)
    if _checked[0] is raw and raw is not None:
        return _checked[1]
    conf = inbox_settings()
    problems = conf.validate()
    if problems:
        raise ConfigurationError(" ".join(problems))
    _checked[0], _checked[1] = raw, conf
    return conf


def metrics_allow_problems(allow: object) -> list[str]:
    """What is wrong with METRICS_ALLOW (a list of networks), as sentences."""
    import ipaddress

    if not isinstance(allow, list | tuple) or not all(isinstance(a, str) for a in allow):
        return [f"METRICS_ALLOW must be a list of networks, e.g. ['10.0.0.0/8'] (got {allow!r})."]
    problems = []
    for network in allow:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            problems.append(f"METRICS_ALLOW: {network!r} is not a network (e.g. 10.0.0.0/8).")
    return problems


def webhook_problems(conf: InboxSettings) -> list[str]:
    """What is wrong with the WEBHOOK_ settings, as sentences."""
    problems = []
    timeout = conf.WEBHOOK_TIMEOUT_SECONDS
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 300:
        problems.append(f"WEBHOOK_TIMEOUT_SECONDS must be > 0 and at most 300 (got {timeout!r}).")
    schedule = conf.WEBHOOK_RETRY_SCHEDULE
    if (
        not isinstance(schedule, list | tuple)
        or not schedule
        or not all(
            isinstance(s, int | float) and not isinstance(s, bool) and s >= 0 for s in schedule
        )
    ):
        problems.append(
            "WEBHOOK_RETRY_SCHEDULE must be a non-empty list of seconds >= 0, e.g. "
            f"[5, 300, 1800] (got {schedule!r})."
        )
    for name in ("WEBHOOK_DISABLE_AFTER", "WEBHOOK_ROTATION_GRACE"):
        value = getattr(conf, name)
        if not isinstance(value, timedelta) or value.total_seconds() <= 0:
            problems.append(f"{name} must be a positive duration (got {value!r}).")
    types = conf.WEBHOOK_EVENT_TYPES
    if not isinstance(types, list | tuple) or not all(
        isinstance(t, str) and 0 < len(t) <= 128 for t in types
    ):
        problems.append(f"WEBHOOK_EVENT_TYPES must be a list of event type names (got {types!r}).")
    if not isinstance(conf.WEBHOOK_ALLOW_PRIVATE, bool):
        problems.append(
            f"WEBHOOK_ALLOW_PRIVATE must be True or False (got {conf.WEBHOOK_ALLOW_PRIVATE!r})."
        )
    return problems


def backfill_problems(conf: InboxSettings) -> list[str]:
    """What is wrong with the backfills' and exports' settings, as sentences."""
    problems = []
    if not isinstance(conf.ENVIRONMENT, str) or len(conf.ENVIRONMENT) > 64:
        problems.append(
            f"ENVIRONMENT must be a name of at most 64 characters (got {conf.ENVIRONMENT!r})."
        )
    for name in ("BACKFILL_STALL_SECONDS", "EXPORT_LINK_SECONDS", "EXPORT_MAX_PART_BYTES"):
        value = getattr(conf, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            problems.append(f"{name} must be a positive number (got {value!r}).")
    retention = conf.EXPORT_RETENTION
    if not isinstance(retention, timedelta) or retention.total_seconds() <= 0:
        problems.append(f"EXPORT_RETENTION must be a positive duration (got {retention!r}).")
    if not isinstance(conf.EXPORT_PREFIX, str) or not conf.EXPORT_PREFIX.strip("/"):
        problems.append(f"EXPORT_PREFIX must be a folder name (got {conf.EXPORT_PREFIX!r}).")
    return problems
