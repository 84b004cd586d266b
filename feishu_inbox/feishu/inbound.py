"""What the webhook and the long connection do with a decoded event: the same for both.

``store`` gives an event its keys and stores it once (``ledger.enqueue``, one transaction):
the same dedupe key, partition and private flag whichever path brought it, so an event seen
on both paths, or redelivered to another connection, is one job. ``answer_card`` decides a
click on a question's button (``questions.py``), or runs the site's ``@card_callback`` within
its budget; whatever goes wrong answers ``{}``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connections

from .. import telemetry, tracing
from ..ledger import outages, replication, tenants
from ..ledger import rules as ledger
from ..ledger.rules import EnqueueResult
from . import protocol, questions, tenancy, turns

log = logging.getLogger("feishu_inbox.inbound")

_card_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="feishu-card")


def store(
    app: str,
    envelope: protocol.Envelope,
    keys: protocol.EventKeys | None = None,
    *,
    transport: str = "webhook",
    traceparent: str = "",
) -> EnqueueResult:
    """Store ``envelope`` once for ``app`` (with ``keys``, or the ones its type's key function
    gives); raises ``ProtocolError`` for keys no database can store, Django's ``DataError``
    for a payload it refuses, ``DatabaseError`` in an outage.

    Traced (``tracing.py``) as ``feishu_inbox receive``: a child of the current span (the
    request's), else of ``traceparent`` (the delivery's header), else a new trace; the job
    keeps that span's context."""
    if envelope.event_type == tenancy.APP_TICKET_EVENT and tenancy.is_store_app(app):
        return _store_ticket(app, envelope, transport)
    if keys is None and envelope.event_type == turns.RECALL_EVENT:
        keys = protocol.keys_for(envelope)
        if not protocol.has_key_function(envelope.event_type):
            keys = turns.recall_keys(app, keys, envelope)
    keys = keys or protocol.keys_for(envelope)
    with tracing.span(
        "feishu_inbox receive",
        kind="server" if transport == "webhook" else "consumer",
        parent=traceparent,
        attributes={
            "feishu_inbox.app": app,
            "feishu_inbox.transport": transport,
            "feishu_inbox.event.id": envelope.event_id,
            "feishu_inbox.event.type": envelope.event_type,
            "feishu_inbox.tenant": envelope.tenant_key,
        },
    ) as span:
        try:
            result = ledger.enqueue(
                app=app,
                event_id=envelope.event_id,
                event_type=envelope.event_type,
                dedupe_key=keys.dedupe_key,
                partition_key=partition_of(app, keys),
                private_message=keys.private_message,
                payload=envelope.body,
                payload_json=envelope.raw,
                tenant=tenancy.job_tenant(app, envelope),
            )
        except DatabaseError as exc:
            if outages.database_away(exc):
                # A session on a server that is no longer the primary (25006) still answers
                # its health check: closed, the next delivery connects to the new primary.
                connections["default"].close()
            raise
        answer = "stored" if result.created else "duplicate"
        span.set("feishu_inbox.job.id", result.job_id)
        span.set("feishu_inbox.answer", answer)
    telemetry.DELIVERIES.labels(app, transport, answer).inc()
    if result.created:
        acknowledged = replication.at_ingest()
        telemetry.INGEST_REPLICATION.labels(acknowledged.kind).inc()
        telemetry.INGEST_LAG_BYTES.observe(acknowledged.lag_bytes)
    log.info(
        "%s event %s (type %s, app %s, partition %s) as job %s",
        answer,
        envelope.event_id,
        envelope.event_type,
        app,
        partition_of(app, keys),
        result.job_id,
    )
    return result


def _store_ticket(app: str, envelope: protocol.Envelope, transport: str) -> EnqueueResult:
    """A store app's ``app_ticket`` is kept in the ledger (the newest wins), not made a job:
    it is a secret, which no job's payload (shown in the admin) may hold. Job id 0."""
    try:
        kept = tenancy.store_ticket(app, envelope.body)
    except DatabaseError as exc:
        if outages.database_away(exc):
            connections["default"].close()
        raise
    answer = "stored" if kept else "duplicate"
    telemetry.DELIVERIES.labels(app, transport, answer).inc()
    return EnqueueResult(job_id=0, created=kept, received_at=None)


def partition_of(app: str, keys: protocol.EventKeys) -> str:
    """The ledger's partition key: the app's name before the event's own."""
    return f"{app}:{keys.partition_key}"[:255]


def answer_card(app: str, envelope: protocol.Envelope, budget: float) -> dict[str, Any]:
    """The registered callback's answer to a ``card.action.trigger``, or ``{}`` when there is
    none, it raises, it answers something else than a dict, or it takes over ``budget``.
    A click on a button of ``feishu_inbox.ask``'s card is decided and answered by
    ``questions.answer_click`` instead (the site's callback never sees it)."""
    click = questions.click_of(envelope)
    if click is not None:
        return questions.answer_click(click, budget, envelope.event_id)
    stopping = turns.stop_click(envelope)
    if stopping is not None:  # a streamed card's stop button (SPEC §9g)
        return turns.answer_stop(stopping)
    callback = protocol.card_callback_for(app)
    if callback is None:
        return {}
    action = protocol.CardAction(app=app, envelope=envelope)
    deadline = time.monotonic() + budget

    def run() -> dict[str, Any] | None:
        if time.monotonic() > deadline:  # queued behind slow ones: Feishu has its {} already
            return None
        try:  # what it enqueues is the click's tenant's (a store app's organisation's)
            with tenants.tenant(tenancy.job_tenant(app, envelope)):
                return callback(action)
        finally:
            connections.close_all()  # this thread's own connections

    future = _card_pool.submit(run)
    try:
        answer = future.result(timeout=max(budget, 0.0))
    except FutureTimeout:
        log.error("card callback for %s took over %.1fs; answered {}", envelope.event_id, budget)
        return {}
    except Exception:
        log.exception("card callback for %s raised; answered {}", envelope.event_id)
        return {}
    if not isinstance(answer, dict):
        log.error("card callback returned %s, not a dict; answered {}", type(answer).__name__)
        return {}
    try:
        encode_answer(answer)
    except (TypeError, ValueError, RecursionError) as exc:
        log.error("card callback's answer is not JSON (%s); answered {}", type(exc).__name__)
        return {}
    return answer


def encode_answer(answer: dict[str, Any]) -> bytes:
    """A card callback's answer as JSON (dates and decimals as Django's JsonResponse does)."""
    return json.dumps(answer, cls=DjangoJSONEncoder).encode()


#: The database's own words for each cause of an outage the metrics count.
_CAUSES = (
    ("read_only", ("read-only", "recovery", "hot standby")),
    (
        "too_many_clients",
        ("too many clients", "remaining connection slots", "too many connections"),
    ),
    ("refused", ("connection refused", "could not connect", "no such file or directory")),
    ("timeout", ("timeout", "timed out", "canceling statement")),
    ("locked", ("database is locked", "lock")),
)
#: A password in a connection string or a keyword (``postgres://u:pw@h``, ``password=pw``).
_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*(@)|(password\s*=\s*)\S+", re.IGNORECASE)


def _without_password(text: str) -> str:
    return _PASSWORD.sub(lambda m: f"{m[1]}***{m[2]}" if m[1] else f"{m[3]}***", text)


def refused_by(exc: BaseException) -> str:
    """What a row check refused, as the refusal names it: the column or constraint of an
    ``IntegrityError`` (PostgreSQL's diagnostics; SQLite's "… constraint failed: …" words)."""
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None and (diag.column_name or diag.constraint_name):
        return str(diag.column_name or diag.constraint_name)
    found = re.search(r"constraint failed: (.*)", str(exc))
    if found is None:
        return ""
    what = found.group(1)
    name = re.search(r'"(\w+)"', what) or re.search(r"\.(\w+)", what) or re.search(r"(\w+)", what)
    return name.group(1) if name else ""


def unstorable(exc: BaseException) -> str:
    """The refusal's message for a delivery a row check refused, naming what it refused."""
    what = refused_by(exc)
    return "A row check of the ledger refused the event" + (f" ({what})." if what else ".")


def database_failure(exc: BaseException) -> tuple[str, str]:
    """The cause of a database failure (a metrics label) and the database's own words: the
    first line of its message, no password in it (the rest quotes the statement)."""
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    lowered = first.lower()
    cause = next((c for c, words in _CAUSES if any(w in lowered for w in words)), "other")
    return cause, _without_password(first)
