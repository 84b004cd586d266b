"""A running job's writes to the ledger, tried again through a database blink (SPEC §6).

The worker's finishes and the handler API's effect and step records all go through ``write``:
when the connection drops, it reconnects and tries again while the job's lease lasts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from .. import telemetry
from ..errors import LeaseLost
from .context import JobContext

log = logging.getLogger("feishu_inbox.handlers")

T = TypeVar("T")

#: Database errors of the connection, not of the statement: the server was away (restarted,
#: failed over, the SQLite file locked past its busy timeout). A write may be tried again.
#: Among the others, those ``outages.database_away`` names are too (a read-only server after
#: a failover): ``transient`` tells.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is the database being away: the write is tried again on a new
    connection (never a job's failure)."""
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    from ..ledger.outages import database_away  # here: this module is imported with the app

    return database_away(exc)


#: The first wait before trying a write again, doubled up to the longest.
RETRY_FIRST_DELAY = 0.05
RETRY_LONGEST_DELAY = 1.0
#: A write is not tried again when the lease has less than this left by the worker's clock.
LEASE_MARGIN = 1.0


def write(ctx: JobContext, doing: str, op: Callable[[bool], T]) -> T:
    """Run a ledger write of this job; when the database blinks, reconnect and try again,
    while the lease lasts (SPEC §6).

    ``op(retrying)`` is called with ``retrying=True`` after the first try, whose reply may have
    been lost after it landed: every ledger write is fenced by the lease token and written so
    that a retry can never apply twice or after a takeover. Raises ``LeaseLost`` (and marks the
    job lost) when the lease runs out before the database is back.
    """
    delay, retrying = RETRY_FIRST_DELAY, False
    while True:
        try:
            return op(retrying)
        except (DatabaseError, InterfaceError) as exc:
            if not transient(exc):
                raise
            drop_connection()
            left = ctx.lease_left() - LEASE_MARGIN
            if left <= 0:
                why = f"the ledger was unreachable until its lease ran out ({exc})"
                ctx.mark_lost(why)
                raise LeaseLost(f"Cannot {doing} job {ctx.event.job_id}: {why}.") from exc
            log.warning(
                "job %s: could not %s (%s); trying again while its lease lasts (%.0fs)",
                ctx.event.job_id,
                doing,
                str(exc).strip() or type(exc).__name__,
                left,
            )
            telemetry.WRITE_RETRIES.inc()
            time.sleep(min(delay, left))  # a backoff between tries, not a synchronisation
            delay, retrying = min(delay * 2, RETRY_LONGEST_DELAY), True


def drop_connection() -> None:
    """Close this thread's broken connection; the next query opens a new one."""
    try:
        connection.close()
    except DatabaseError:  # closing a dead connection can fail too; it is gone either way
        log.debug("closing a broken connection failed", exc_info=True)
