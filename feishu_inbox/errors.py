"""Typed errors, and the catalogue of every code an operator or a caller can meet.

Each refusal has a stable ``code``, a ``message`` (what was wrong) and a ``fix`` (what to do).
Operators see the same words, code first, in admin messages, ``manage.py inbox`` output (and
its ``--json``) and the webhook's JSON errors. ``CATALOGUE`` is the one table of codes; the
docs/operating.md prints it, and a test keeps the two and the code in step.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

#: Error messages kept on a job are cut to this many characters.
ERROR_MESSAGE_LIMIT = 4000


def truncate(message: str) -> str:
    if len(message) <= ERROR_MESSAGE_LIMIT:
        return message
    return message[: ERROR_MESSAGE_LIMIT - 1] + "…"


#: code → (what it means, what to do). Webhook codes answer a delivery; the others refuse an
#: operation, and nothing changed (``backfills/refusals.py`` adds its own when imported).
CATALOGUE: dict[str, tuple[str, str]] = {
    # configuration and arguments
    "configuration": (
        "settings.FEISHU_INBOX, a handler or a schedule is invalid.",
        "Correct it; `python manage.py check` lists every problem.",
    ),
    "invalid_argument": (
        "An operation was called with arguments it cannot take (every problem is named).",
        "Fix the call; nothing was stored or changed.",
    ),
    "invalid_task": (
        "A django.tasks task cannot be stored in the ledger (its path, queue name, arguments "
        "or ordering key); nothing was enqueued.",
        "Fix what the message names: JSON arguments, a queue name without ':', a short "
        "ordering key.",
    ),
    "schedule_configuration": (
        "A schedule declaration is invalid (its cron, time zone, catch-up policy or target).",
        "Fix each declaration (@feishu_inbox.schedule or FEISHU_INBOX['SCHEDULES']); "
        "`python manage.py check` lists them (feishu_inbox.E004).",
    ),
    # jobs and operators
    "not_found": (
        "There is no job with this id.",
        "Check the id (`python manage.py inbox list`); completed jobs are purged after "
        "COMPLETED_RETENTION.",
    ),
    "pause_not_found": (
        "Nothing of this kind and name is paused.",
        "`python manage.py inbox pauses` lists what is paused (and since when, by whom).",
    ),
    "paused": (
        "An operator paused this job's chat, app, event type or queue: it waits, held, and "
        "spent no attempt; the chat's later jobs wait behind it.",
        "Resume it (`inbox resume ...`, or the admin's Pauses page) when the cause is fixed.",
    ),
    "schedule_not_found": (
        "No schedule of this name is declared.",
        "Check the name: `python manage.py inbox schedules` lists the declared schedules.",
    ),
    "invalid_state": (
        "The job is not in a state this action applies to.",
        "Choose the action its state allows (the operator actions table, docs/operating.md).",
    ),
    "not_requeueable": (
        "The job is live (queued, running, waiting to retry, failed or unknown): it cannot be "
        "replayed.",
        "Replay completed jobs only; cancel a queued or running one, requeue or discard a "
        "failed one, reconcile an unknown one.",
    ),
    "job_tenant_required": (
        "TENANT_REQUIRED is on and the job declared no tenant; nothing was stored.",
        "Pass tenant= (a tenant's key, or '' for work of no tenant), or enqueue inside "
        "`with feishu_inbox.tenant(key):`.",
    ),
    "duplicate": (
        "Another live job holds the same event (its event id or dedupe key).",
        "Let that job finish, or cancel it, then replay.",
    ),
    "unknown_step": (
        "The job has no step of that name to run again from.",
        "Name one of its steps (the job's admin page lists them), or leave the step out.",
    ),
    "duplicate_step": (
        "A handler ran two steps under one name in one attempt.",
        "Give each step of a handler its own name.",
    ),
    "duplicate_effect": (
        "A handler began two idempotent effects under one name in one attempt: they would "
        "share a key, and the remote side would drop the second.",
        "Give each idempotent effect of a handler its own name.",
    ),
    "idempotency_window_passed": (
        "A retried job was about to re-issue an idempotent effect after its window (less the "
        "margin): the remote side might no longer deduplicate it, so it was not started and "
        "the job ends unknown.",
        "Check whether the effect happened (for a reply: look in the chat), then reconcile.",
    ),
    "rate_limited": (
        "A job waits for a rate limit kept by the ledger (a chat's, an app's, or one of the "
        "site's own) or for Feishu's reset after a 429: it was handed back, due when a token "
        "is there, without spending an attempt, and started no effect.",
        "Nothing: it runs when the bucket refills. If many wait, the limits (FEISHU_RATE_LIMITS "
        "or a RateLimit of yours) are below the traffic; the dashboard shows each bucket.",
    ),
    "timed_out": (
        "A job ran past its handler's timeout: the attempt was stopped (at a checkpoint, a "
        "step or an effect, or by the worker, which fenced its lease) and retried by its "
        "policy, or ended unknown when an effect was in flight.",
        "Find what it waited on (the attempt's history names the timeout); raise the timeout "
        "with @handler(..., timeout=...) if the work is genuinely that long.",
    ),
    "wait_timed_out": (
        "A job's wait for a signal reached its timeout before the signal came.",
        "Catch feishu_inbox.WaitTimedOut in the handler to act on the timeout; uncaught, the "
        "job fails at once (running it again would only time out again).",
    ),
    "wait_refused": (
        "A handler may not wait here: an effect of this attempt ran outside a step (a resumed "
        "run would repeat it), the job is a django.tasks task, or the wait's name or key "
        "differs from what an earlier run of the job waited for.",
        "Put each effect before a wait inside feishu_inbox.step(); wait only in Feishu "
        "handlers and schedules; keep a handler's waits in the same order on every run.",
    ),
    "question_expired": (
        "Nobody answered a card question (feishu_inbox.ask) before its timeout: its card "
        'shows it expired, and a later click is answered "expired".',
        "Catch feishu_inbox.QuestionExpired (or WaitTimedOut) in the handler to act on it; "
        "give ask() a longer timeout if people need more time to answer.",
    ),
    "no_waiter": (
        "No job waits for this signal's key, and the signal was sent with keep=False.",
        "Send it with keep=True (the default) to keep it for the job that will wait, or check "
        "the key.",
    ),
    "workflow_refused": (
        "A workflow call would break a promise: a child awaited by another wait still open, "
        "a member added to a closed batch, a job spec that names no handler or task, a spawn "
        "in a cancelled job. Nothing changed.",
        "Do what the message says: wait for each child once, add members before close(), "
        "spawn a registered event type or a @task function.",
    ),
    "child_failed": (
        "A child or batch member did not complete (it failed, was cancelled or discarded), "
        "and its result was asked for (Outcome.value).",
        "Look at Outcome.ok before Outcome.value, or catch feishu_inbox.ChildFailed; the "
        "child's own job says why it failed.",
    ),
    "lease_lost": (
        "The worker no longer holds the job: its lease expired or another worker took it.",
        "Stop working on it; lease expiry recovers it. If this happens often, raise LEASE_SECONDS.",
    ),
    # webhook deliveries
    "method_not_allowed": ("Feishu delivers events with POST.", "Send a POST."),
    "too_large": ("The body is over MAX_BODY_BYTES.", "Raise MAX_BODY_BYTES if it is genuine."),
    "length_required": (
        "A chunked body reached a server that does not de-chunk it.",
        "Serve the webhook with gunicorn, or send a Content-Length.",
    ),
    "invalid_json": ("The body is not a JSON object.", "Check what is posting to the URL."),
    "too_deep": (
        "The JSON nests deeper than 64 levels.",
        "Nothing Feishu sends nests that deep: check the sender.",
    ),
    "missing_fields": (
        "The event has no usable id or type (or the URL verification no challenge).",
        "Check the sender.",
    ),
    "unknown_schema": (
        "Neither a schema 2.0 nor a 1.0 event envelope.",
        "Check the sender; Feishu sends one of the two.",
    ),
    "undecryptable": (
        "The body does not decrypt with the app's Encrypt Key.",
        "Copy the Encrypt Key from the app's Event Subscriptions page into APPS.",
    ),
    "not_encrypted": (
        "The app has an Encrypt Key but the body is plain.",
        "Set the same Encrypt Key in the Feishu console, or remove it from APPS.",
    ),
    "missing_signature": (
        "The X-Lark-Signature headers are missing.",
        "Only Feishu's signed deliveries are accepted when an Encrypt Key is set.",
    ),
    "bad_signature": (
        "The signature does not match the body.",
        "Check the app's Encrypt Key; a proxy must not change the body.",
    ),
    "stale_timestamp": (
        "The request timestamp is outside REPLAY_WINDOW_SECONDS of now.",
        "Check the server's clock (NTP).",
    ),
    "bad_token": (
        "The verification token is wrong.",
        "Copy the Verification Token from the Feishu console into APPS.",
    ),
    "unknown_app": ("No Feishu app of this name is configured.", "Add it to APPS."),
    "unstorable_payload": (
        "The database refuses this payload (a NUL character on PostgreSQL).",
        "Nothing to do: Feishu's redelivery could never store it either.",
    ),
    "unstorable_key": (
        "A field the ledger keys the event by (its id, the chat, thread, message or user id)"
        " holds a lone surrogate, which no database can store as text.",
        "Nothing to do: Feishu's redelivery could never store it either; the message says "
        "which field.",
    ),
    # the long connection (feishu_connect); its bad input is ACKed with the codes above
    "bad_frame": (
        "A data frame of the long connection is not one event: a part out of its range, "
        "parts that disagree on their number, a header that is not a number.",
        "Nothing: it is ACKed (redelivery could never store it) and logged with the reason.",
    ),
    "connection_refused": (
        "Feishu refused an app's long connection in a way no retry mends (wrong credentials, "
        "the long connection not enabled for the app, 50 connections per app already open); "
        "feishu_connect exits 78.",
        "Do what the log line says (check APP_ID and APP_SECRET, enable the long connection, "
        "run fewer processes), then start it again.",
    ),
    # Feishu's Open API (replies and sends)
    "feishu_error": (
        "A call to Feishu's Open API did not succeed.",
        "See the message: Feishu's code, its request id (log_id) and what to do.",
    ),
    "feishu_rate_limited": (
        "Feishu's rate limit answered (HTTP 429 or code 99991400); nothing was sent.",
        "Nothing: the job runs again, with the same uuid, at the reset time Feishu gave.",
    ),
    "feishu_transient": (
        "Feishu answered 5xx, or the connection failed: the message may have been sent.",
        "Nothing within the uuid's hour: the job re-sends with the same uuid, which cannot "
        "send it twice.",
    ),
    "feishu_business": (
        "Feishu refused the request (a 4xx or a non-zero code): nothing was sent.",
        "Fix what Feishu's code and message name (the content, the app's permissions or "
        "credentials, the chat), then requeue the job.",
    ),
    # outbound webhooks (docs/webhooks.md)
    "webhook_endpoint_invalid": (
        "An endpoint was refused: its URL is not http(s), carries credentials or reaches a "
        "private address, or its rate limit or event types are wrong; nothing was stored.",
        "Fix what the message names (WEBHOOK_ALLOW_PRIVATE allows the site's own network).",
    ),
    "webhook_endpoint_unknown": (
        "No webhook endpoint has this id.",
        "`python manage.py inbox webhooks list` lists the endpoints and their ids (ep_...).",
    ),
    "webhook_endpoint_disabled": (
        "The endpoint is disabled (an operator, a 410 Gone, or failing for "
        "WEBHOOK_DISABLE_AFTER): its deliveries are held in order, not dropped.",
        "Fix the receiver, then `inbox webhooks enable EP`: what it held is sent, in order.",
    ),
    "webhook_event_invalid": (
        "publish() was refused: an event type or key of a wrong length, or a payload that is "
        "not JSON data; nothing was published.",
        "Publish JSON data (convert dates, decimals and models yourself), a short type and key.",
    ),
    "webhook_event_unknown": (
        "The event type is not in FEISHU_INBOX['WEBHOOK_EVENT_TYPES']; nothing was stored.",
        "Declare the event type in WEBHOOK_EVENT_TYPES, or fix its spelling.",
    ),
    "webhook_delivery_failed": (
        "A delivery got no answer in time, a 3xx, a 408/409/425 or a 5xx: it is sent again, "
        "same webhook-id, on WEBHOOK_RETRY_SCHEDULE until accepted or the endpoint disabled.",
        "Nothing while it retries; the attempts show each answer of the receiver.",
    ),
    "webhook_delivery_rejected": (
        "The receiver answered a 4xx but 408/409/410/425/429: the delivery ended unretried, "
        "and the key's next message went on.",
        "Fix the receiver or the payload, then replay it (`inbox webhooks replay`).",
    ),
    "webhook_delivery_throttled": (
        "The receiver answered 429: the delivery is sent again after its Retry-After.",
        "Nothing; lower the endpoint's rate_limit to what the receiver accepts.",
    ),
    "database_unavailable": (
        "The database is down or locked past its timeout; the event was not stored (the "
        "webhook answers 503, the long connection ACKs code 500).",
        "Nothing: Feishu redelivers. Check the database if it lasts.",
    ),
}


def meaning(code: str) -> str:
    return CATALOGUE[code][0]


def default_fix(code: str) -> str:
    return CATALOGUE[code][1]


class InboxError(Exception):
    """Base class: a stable ``code`` (in ``CATALOGUE``), a ``message`` and a ``fix``."""

    code = "invalid_argument"
    fix = ""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = default_fix(self.code) if fix is None else fix

    def __str__(self) -> str:
        return f"{self.message} {self.fix}".strip()

    def described(self) -> str:
        """``[code] message — fix``, as the CLI and the admin show it."""
        return f"[{self.code}] {self.message}" + (f" — {self.fix}" if self.fix else "")

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "fix": self.fix}


class ConfigurationError(InboxError):
    code = "configuration"
    #: A job that meets it fails at once, its code and fix recorded (runtime/attempts.py): a
    #: worker reads its settings when it starts, so running the job again cannot heal it.
    final = True


class ScheduleConfigurationError(ConfigurationError):
    code = "schedule_configuration"


class LedgerError(InboxError):
    """A ledger operation was refused; nothing changed. Its arguments were wrong, unless a
    subclass says otherwise."""

    code = "invalid_argument"


class PauseNotFound(LedgerError):
    code = "pause_not_found"


class JobNotFound(LedgerError):
    code = "not_found"


class TenantRequired(LedgerError):
    code = "job_tenant_required"


class ScheduleNotFound(LedgerError):
    code = "schedule_not_found"


class InvalidState(LedgerError):
    """The job is not in a state this operation applies to (e.g. requeue of a running job)."""

    code = "invalid_state"


class NotRequeueable(InvalidState):
    """Replay of a live job: only completed jobs run again."""

    code = "not_requeueable"


class Duplicate(LedgerError):
    """Another live job holds the same event."""

    code = "duplicate"


class UnknownStep(LedgerError):
    """``from_step`` names no step of the job; nothing changed."""

    code = "unknown_step"


class DuplicateStep(LedgerError):
    """A handler ran two steps under one name in one attempt (a bug in the handler)."""

    code = "duplicate_step"


class DuplicateEffect(LedgerError):
    """Two idempotent effects of one name in one attempt (a bug in the handler)."""

    code = "duplicate_effect"


class IdempotencyWindowPassed(LedgerError):
    """An idempotent effect was not started: the job's window has passed (it ends unknown)."""

    code = "idempotency_window_passed"


class WaitTimedOut(LedgerError):
    """Raised by ``wait_for`` in the handler when the wait's timeout came before a signal.
    A handler that does not catch it fails its job at once (``final``): a run again would
    find the same memoized timeout."""

    code = "wait_timed_out"
    final = True


class QuestionExpired(WaitTimedOut):
    """Raised by ``ask`` when nobody answered its card question before its timeout (the card
    was updated to say so first). A ``WaitTimedOut``: catch either."""

    code = "question_expired"


class WaitRefused(LedgerError):
    """A wait that would break a promise: after an effect outside a step, in a django.tasks
    task, or unlike the wait an earlier run recorded under its name. Nothing changed."""

    code = "wait_refused"
    final = True


class NoWaiter(LedgerError):
    """``signal(key, keep=False)`` found no job waiting for ``key``; nothing changed."""

    code = "no_waiter"


class WorkflowRefused(LedgerError):
    """A spawn, wait for children, batch or chain that would break a promise (SPEC §9f):
    nothing changed."""

    code = "workflow_refused"
    final = True


class ChildFailed(LedgerError):
    """``Outcome.value`` of a child or member that did not complete: its state and error."""

    code = "child_failed"


class LeaseLost(LedgerError):
    """The caller no longer holds the job: its lease expired, or another worker took it over.

    A worker that gets this must stop working on the job at once: it may not start an effect,
    renew, finish or fail it.
    """

    code = "lease_lost"


class Superseded(BaseException):
    """Raised by ``checkpoint()`` (and by entering ``effect()``) when a newer private message
    waits in the same chat.

    A ``BaseException``, as ``asyncio.CancelledError`` is: a handler's broad
    ``except Exception`` cannot swallow it and go on to the effect the user replaced.
    """


class Cancelled(BaseException):
    """Raised by ``checkpoint()`` (and by entering ``effect()``) when an operator cancelled the
    running job. A ``BaseException`` for the same reason as ``Superseded``."""


class Deferred(BaseException):
    """Raised inside a handler when its job must wait before it may go on (a rate limit has
    no token for it yet): the worker hands the job back, due in ``seconds``, without spending
    an attempt, and its chat's later jobs wait behind it. A ``BaseException``, as
    ``Superseded`` is, so that no ``except Exception`` turns the wait into a failure."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(reason)
        self.seconds = seconds
        self.reason = reason


class Suspended(BaseException):
    """Raised by a wait inside a handler whose wait is recorded open: the worker gives the job
    its ``waiting`` state (no lease, no slot) and the handler's thread back. A ``BaseException``
    for the same reason as ``Superseded``; a handler never needs to catch it."""

    def __init__(self, name: str, what: str) -> None:
        super().__init__(what)
        self.name = name
        self.what = what


class TimedOut(BaseException):
    """Raised by ``checkpoint()``, ``step()`` and entering ``effect()`` once the job has run
    past its handler's ``timeout``. A ``BaseException`` for the same reason as ``Superseded``.
    A handler that reaches none of them is stopped by the worker instead (``TimedOut`` is then
    what its attempt records)."""


# --- Feishu's Open API (feishu/openapi.py) ----------------------------------------------------
# Each class passes its ``fix`` explicitly, so it does not depend on how InboxError finds a
# default one.


class InvalidMessage(InboxError, ValueError):
    """``send_message``/``reply_message`` refused their arguments before any request: every
    problem is named in ``problems``. Nothing was sent."""

    code = "invalid_argument"
    fix = "Fix the call; nothing was sent."
    #: A job that raises it fails at once: running it again cannot help (runtime/worker.py).
    final = True

    def __init__(self, problems: list[str]) -> None:
        super().__init__("Cannot send this message: " + "; ".join(problems) + ".", fix=self.fix)
        self.problems = list(problems)


class FeishuAPIError(InboxError):
    """A call to Feishu's Open API did not succeed. The subclass says what to do next:

    - ``FeishuRateLimited``: not applied; send it again (same ``uuid``) at ``reset_at``;
    - ``FeishuTransientError``: may or may not have been applied; sending it again with the same
      ``uuid`` within Feishu's one-hour dedupe window cannot create a second message;
    - ``FeishuBusinessError``: Feishu refused it (``feishu_code``, ``feishu_msg``); sending it
      again unchanged fails the same way.

    ``status`` is the HTTP status (``None`` when no answer came), ``maybe_applied`` whether
    Feishu may have acted on it, ``log_id`` Feishu's request id (give it to Feishu's support).
    """

    code = "feishu_error"
    #: Whether the same request (same ``uuid``) may be sent again.
    retryable = False

    def __init__(
        self,
        message: str,
        *,
        app: str,
        status: int | None = None,
        feishu_code: int | None = None,
        feishu_msg: str = "",
        log_id: str = "",
        maybe_applied: bool = False,
        fix: str | None = None,
    ) -> None:
        super().__init__(message, fix=self.fix if fix is None else fix)
        self.app = app
        self.status = status
        self.feishu_code = feishu_code
        self.feishu_msg = feishu_msg
        self.log_id = log_id
        self.maybe_applied = maybe_applied


class FeishuRateLimited(FeishuAPIError):
    """HTTP 429, or code 99991400 (older APIs answer it with HTTP 400). Not applied.

    ``reset_at`` (an aware datetime) is when the limit lifts: now plus the response's
    ``x-ogw-ratelimit-reset`` seconds, else its ``Retry-After``, else a short default
    (``openapi.RATE_LIMIT_DEFAULT_WAIT``).
    """

    code = "feishu_rate_limited"
    retryable = True
    fix = "Send it again, with the same uuid, at its reset time."

    def __init__(self, message: str, *, reset_at: datetime, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.reset_at = reset_at


class FeishuTransientError(FeishuAPIError):
    """A 5xx answer, a connection error or a timeout: Feishu may have created the message
    (``maybe_applied``). Re-sending with the same ``uuid`` within an hour cannot create a
    second one."""

    code = "feishu_transient"
    retryable = True
    fix = "Send it again with the same uuid (within an hour of the first try)."


class FeishuBusinessError(FeishuAPIError):
    """Feishu refused the request (a 4xx answer or a non-zero ``code``): nothing was created,
    and sending it again unchanged fails the same way. ``feishu_code`` and ``feishu_msg`` are
    Feishu's own words."""

    code = "feishu_business"
    #: A job that raises it fails at once, with Feishu's code and message (runtime/worker.py).
    final = True
    fix = (
        "Feishu's code and message say what it refused (the message, the app's permissions "
        "or credentials, the chat); fix that, then run the job again."
    )


class Concluded(BaseException):
    """Raised by a job kind's run function to end its job ``completed`` with ``note`` kept as
    its error type (what ``NoHandler`` does): running it again cannot help, and its partition
    must go on (a webhook delivery the receiver rejected). Outside any effect."""

    def __init__(self, note: str, message: str = "") -> None:
        super().__init__(message or note)
        self.note = note
