"""What the ledger's processes count, for Prometheus (SPEC §9d): one ``feishu_inbox_`` prefix,
``_total`` counters, ``_seconds`` units, low-cardinality labels (event type or task, app,
outcome; never a chat, job or event id).

The instruments live in ``prometheus_client``'s default registry (the ``metrics`` extra), so a
site's own metrics and gunicorn's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) work as
with any Python app; without the package every instrument is a no-op that costs one method
call, and so with ``FEISHU_INBOX_METRICS=off`` in the environment. The ledger's own gauges
(jobs per state, the oldest due job, blocked chats) are not here: they are read from the
database when scraped (``monitoring/``).

A leaf: this module imports nothing of the package, so every layer may count.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import Any

prometheus_client: Any = None
#: FEISHU_INBOX_METRICS=off (or 0) counts nothing even where the package is installed.
if os.environ.get("FEISHU_INBOX_METRICS", "on").lower() not in ("0", "off", "false", "no"):
    try:
        prometheus_client = import_module("prometheus_client")
    except ImportError:  # the metrics extra is not installed: count nothing
        prometheus_client = None

#: Handler and Open API durations: from a fast handler's few milliseconds to an LLM call's
#: minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: Waits from due to start: from a NOTIFY's milliseconds to a backlog's minutes.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class _Nothing:
    """What an instrument is without prometheus_client: every call does nothing."""

    def labels(self, *values: Any, **named: Any) -> _Nothing:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


class _Labelled:
    """A labelled instrument whose children are kept by label values: ``labels()`` on the hot
    path is one dict lookup instead of prometheus_client's checks and lock (a race makes the
    same child twice: prometheus_client returns one object per label values)."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        found = self._children.get(values)
        if found is None:
            found = self._children[values] = self._metric.labels(*values)
        return found


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
    if prometheus_client is None:
        return _Nothing()
    metric = prometheus_client.Counter(name, doc, labels)
    return _Labelled(metric) if labels else metric


def _histogram(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Any:
    if prometheus_client is None:
        return _Nothing()
    metric = prometheus_client.Histogram(name, doc, labels, buckets=buckets)
    return _Labelled(metric) if labels else metric


ENABLED = prometheus_client is not None

# --- the worker ---------------------------------------------------------------------------------

#: outcome: completed, failed, unknown, retried, superseded, cancelled, timed_out, deferred
#: (handed back to wait for a limit or a pause), waiting (a durable wait began), lease_lost.
JOBS_FINISHED = _counter(
    "feishu_inbox_jobs_finished",
    "Attempts ended by this process, by event type (or task) and outcome.",
    ("event_type", "outcome"),
)
HANDLER_SECONDS = _histogram(
    "feishu_inbox_handler_duration_seconds",
    "How long handlers ran, by event type (or task).",
    ("event_type",),
    DURATION_BUCKETS,
)
WAIT_SECONDS = _histogram(
    "feishu_inbox_job_wait_seconds",
    "From when a job was due to when this process started it, by event type (or task).",
    ("event_type",),
    WAIT_BUCKETS,
)
#: result: jobs (it claimed some), empty, error (the database was away).
CLAIMS = _counter("feishu_inbox_claims", "Claim statements this process ran.", ("result",))
CLAIMED_JOBS = _counter("feishu_inbox_claimed_jobs", "Jobs this process claimed.")
#: result: renewed, lost (the lease was gone), error (the database was away).
RENEWALS = _counter(
    "feishu_inbox_lease_renewals", "Lease renewals this process asked for.", ("result",)
)
LEASE_EXPIRIES = _counter(
    "feishu_inbox_lease_expiries",
    "Expired leases (of any worker) this process recovered.",
)
WRITE_RETRIES = _counter(
    "feishu_inbox_ledger_write_retries",
    "A running job's ledger writes tried again after a database error (a blink).",
)
#: result: recorded (the function ran), memoized (an earlier attempt's result).
STEPS = _counter("feishu_inbox_steps", "Steps, by whether they ran.", ("result",))
#: result: started, done, uncertain (it raised: the job will end unknown unless idempotent).
EFFECTS = _counter("feishu_inbox_effects", "Effects, by how they went.", ("result",))
#: event: suspended (a job started to wait), signalled (a signal resumed one), kept (a signal
#: nobody waited for yet, kept), timed_out (a wait's time came), by_operator.
WAITS = _counter("feishu_inbox_waits", "Waits of jobs, by what happened to them.", ("event",))
#: Workflows (SPEC §9f): children spawned; batches (a batch, a parent's wait for its
#: children, a chain) opened, fired, stopped; callbacks enqueued by batches that fired.
WORKFLOW_CHILDREN = _counter("feishu_inbox_children_spawned", "Child jobs spawned by parents.")
BATCHES = _counter(
    "feishu_inbox_batches",
    "Batches by kind (batch, children, chain) and event (opened, fired, stopped).",
    ("kind", "event"),
)
BATCH_CALLBACKS = _counter(
    "feishu_inbox_batch_callbacks", "Callback jobs enqueued by batches that fired (once each)."
)
#: Conversation turns (SPEC §9g).
TURNS = _counter(
    "feishu_inbox_turns",
    "Turns formed, by how they started: run, recalled (every message recalled), stopped (a "
    "stop command before it ran), stale (skipped or noticed past the handler's deadline), "
    "late (past the deadline and run, on_stale='run').",
    ("event_type", "start"),
)
TURN_MESSAGES = _counter(
    "feishu_inbox_turn_messages",
    "Messages taken into a turn behind its first (coalesced), merged into a running one "
    "(merged), or recalled from one (recalled).",
    ("how",),
)
TURN_SIGNALS = _counter(
    "feishu_inbox_turn_signals",
    "What a running turn learned at a safe point: stop, recall, merge, supersede.",
    ("signal",),
)
TURN_CLEANUPS = _counter(
    "feishu_inbox_turn_cleanups", "Cleanup jobs enqueued after their turn ended (once each)."
)
#: How long a resumed job waited, from its wait's start to the resumed handler reading it.
WAITED_SECONDS = _histogram(
    "feishu_inbox_waited_seconds",
    "Seconds a job waited (a sleep or a wait for a signal) until its handler resumed.",
    ("outcome",),
    (0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300, 900, 3600, 21600, 86400, 604800),
)

# --- Feishu -------------------------------------------------------------------------------------

#: api: the method and path template ("POST /open-apis/im/v1/messages/:message_id/reply");
#: result: ok, rate_limited, transient, refused.
OPENAPI_REQUESTS = _counter(
    "feishu_inbox_openapi_requests",
    "Open API requests, by API and result.",
    ("app", "api", "result"),
)
OPENAPI_SECONDS = _histogram(
    "feishu_inbox_openapi_request_duration_seconds",
    "How long Open API requests took, by API.",
    ("api",),
    DURATION_BUCKETS,
)
#: transport: webhook, long_connection; answer: stored, duplicate, or the refusal's code
#: (bad_signature, stale, …: errors.CATALOGUE).
DELIVERIES = _counter(
    "feishu_inbox_deliveries",
    "Deliveries from Feishu, by app, transport and what they were answered.",
    ("app", "transport", "answer"),
)
DATABASE_OUTAGES = _counter(
    "feishu_inbox_database_outages",
    "Deliveries not stored because the database failed (webhook 503, long connection 500), "
    "by app, transport and cause (read_only, refused, too_many_clients, timeout, locked, "
    "other).",
    ("app", "transport", "cause"),
)

# --- outbound webhooks ----------------------------------------------------------------------

#: outcome: accepted, rejected, retried, throttled, gone, timed_out, failed (no answer), held.
#: No endpoint, URL or event type label: their number is the site's customers'.
WEBHOOK_ATTEMPTS = _counter(
    "feishu_inbox_webhook_attempts",
    "Outbound webhook requests, by outcome.",
    ("outcome",),
)
WEBHOOK_SECONDS = _histogram(
    "feishu_inbox_webhook_request_duration_seconds",
    "How long outbound webhook requests took (connect to the answer's first KiB), by outcome.",
    ("outcome",),
    DURATION_BUCKETS,
)
#: reason: gone (410), failing (every attempt failed for WEBHOOK_DISABLE_AFTER), operator.
BACKFILL_ROWS = _counter(
    "feishu_inbox_backfill_rows", "Rows backfilled in committed batches.", ("backfill",)
)
BACKFILL_BATCHES = _counter(
    "feishu_inbox_backfill_batches", "Backfill batches committed.", ("backfill",)
)
EXPORT_ROWS = _counter("feishu_inbox_export_rows", "Rows written into export parts.", ("result",))
EXPORT_PARTS = _counter("feishu_inbox_export_parts", "Export parts written to their storage.")
WEBHOOK_DISABLED = _counter(
    "feishu_inbox_webhook_endpoints_disabled",
    "Outbound webhook endpoints disabled, by reason.",
    ("reason",),
)

# --- the database's replication ---------------------------------------------------------------

#: replication: sync (a synchronous standby confirmed the commit), async (standbys, none
#: synchronous: lost if the primary is lost before they flush it), none (no standby),
#: unknown (the standbys' state is not readable by the site's role: grant pg_monitor).
INGEST_REPLICATION = _counter(
    "feishu_inbox_ingest_replication",
    "Events stored (and acknowledged), by the replication their commit had at the time.",
    ("replication",),
)
INGEST_LAG_BYTES = _histogram(
    "feishu_inbox_ingest_replication_lag_bytes",
    "At each stored event, the WAL bytes the furthest-behind standby had not flushed "
    "(sampled once a second): what an asynchronous standby's promotion would lose.",
    (),
    (0, 8192, 65536, 524288, 4194304, 33554432, 268435456, 2147483648),
)
