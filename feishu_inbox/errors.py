"""Typed errors. Each says what was wrong (``message``) and what to do (``fix``).

Operators see the same words in admin messages and in ``manage.py inbox`` output.
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


class InboxError(Exception):
    """Base class: a stable ``code``, a ``message`` and a ``fix``."""

    code = "inbox_error"
    fix = ""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if fix is not None:
            self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} {self.fix}".strip()


class ConfigurationError(InboxError):
    code = "configuration"
    fix = "Correct settings.FEISHU_INBOX; `python manage.py check` lists every problem."


class LedgerError(InboxError):
    """A ledger operation was refused; nothing changed."""

    code = "refused"


class JobNotFound(LedgerError):
    code = "not_found"
    fix = "Check the job id (`python manage.py inbox list`); completed jobs are purged."


class InvalidState(LedgerError):
    """The job is not in a state this operation applies to (e.g. requeue of a running job)."""

    code = "invalid_state"


class LeaseLost(LedgerError):
    """The caller no longer holds the job: its lease expired, or another worker took it over.

    A worker that gets this must stop working on the job at once: it may not start an effect,
    renew, finish or fail it.
    """

    code = "lease_lost"
    fix = (
        "Stop working on this job; it has been or will be recovered by lease expiry. "
        "If this happens often, raise the lease length or renew more often."
    )


class Superseded(BaseException):
    """Raised by ``checkpoint()`` (and by entering ``effect()``) when a newer private message
    waits in the same chat.

    A ``BaseException``, as ``asyncio.CancelledError`` is: a handler's broad
    ``except Exception`` cannot swallow it and go on to the effect the user replaced.
    """


# --- Feishu's Open API (openapi.py) -----------------------------------------------------------
# Each class passes its ``fix`` explicitly, so it does not depend on how InboxError finds a
# default one.


class InvalidMessage(InboxError, ValueError):
    """``send_message``/``reply_message`` refused their arguments before any request: every
    problem is named in ``problems``. Nothing was sent."""

    code = "invalid_argument"
    fix = "Fix the call; nothing was sent."

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
    fix = (
        "Feishu's code and message say what it refused (the message, the app's permissions "
        "or credentials, the chat); fix that, then run the job again."
    )
