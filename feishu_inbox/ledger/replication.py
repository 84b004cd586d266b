"""What an acknowledged event's commit reached: the replication at the moment of ingest.

An event is answered 200 (or ACKed) after its commit; Feishu never sends it again. When the
primary is lost and a standby promoted, the event survives only if the standby had it: with a
synchronous standby (``synchronous_standby_names`` naming it, ``synchronous_commit`` ``on`` or
``remote_write``/``remote_apply``) the commit waited for it; with an asynchronous one, what it
had not flushed yet is lost. So each stored event is counted by the replication its commit had
(``sync``, ``async``, ``none``: no standby, ``unknown``: the role may not read the standbys'
state, grant it ``pg_monitor``), with the furthest standby's lag in WAL bytes, sampled from
the primary at most once a second per process (``docs/guarantees.md``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError

from ..store import store

log = logging.getLogger("feishu_inbox.webhook")

#: Seconds a sample of the primary's replication state is used before it is read again.
SAMPLE_SECONDS = 1.0
#: Settings of ``synchronous_commit`` under which a commit waits for a synchronous standby.
WAITS_FOR_STANDBY = frozenset({"on", "remote_write", "remote_apply"})


@dataclass(frozen=True)
class Replication:
    #: sync, async, none or unknown (module docstring).
    kind: str
    #: WAL bytes the furthest-behind standby had not flushed (0: none, or not readable).
    lag_bytes: int


NONE = Replication("none", 0)
_lock = threading.Lock()
_sample: list[tuple[float, Replication]] = []


def at_ingest() -> Replication:
    """The replication a commit made just now had (sampled, ``SAMPLE_SECONDS``)."""
    now = time.monotonic()
    with _lock:
        if _sample and now - _sample[0][0] < SAMPLE_SECONDS:
            return _sample[0][1]
    found = read()
    with _lock:
        _sample[:] = [(now, found)]
    return found


def read() -> Replication:
    """The primary's replication state, read now (``unknown`` when it cannot be read)."""
    try:
        row = store().replication()
    except DatabaseError as exc:
        log.debug("replication state not read (%s)", exc)
        return Replication("unknown", 0)
    if row is None:
        return NONE
    lag = int(row["lag_bytes"] or 0)
    if row["in_recovery"]:
        return Replication("unknown", 0)
    if not row["standbys"]:
        return NONE
    if row["synchronous_commit"] in WAITS_FOR_STANDBY and row["sync_standbys"]:
        return Replication("sync", lag)
    if row["unreadable"] == row["standbys"]:
        return Replication("unknown", 0)
    return Replication("async", lag)
