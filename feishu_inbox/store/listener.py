"""A worker's LISTEN connection (PostgreSQL): subscribed again after every break, and proven
to hear the notices the enqueuers send before the worker trusts it.

A LISTEN can succeed and hear nothing: through a pooler in transaction mode it subscribes one
pooled server session, which goes back to the pool, and no notice reaches the client (a worker
then slept its longest sleep, 30 s, before each new job). So after each LISTEN the listener
sends a probe the way the enqueuers send their notices (``probe``: the default database) and
waits for it. Heard: wake-ups arrive, the worker may sleep long. Not heard: the subscription is
dropped (``UNLISTEN``: no session state left on a pooled session), the worker polls, and the
listener tries again after ``RETRY_AFTER_DEAF``. A quiet connection is checked with a query
every ``QUIET_CHECK`` seconds, so a primary gone without a word (killed, failed over) is seen
within seconds; the next connection, through a connection string that names every host with
``target_session_attrs=read-write``, subscribes on the new primary.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import DatabaseError

from .schema import NOTIFY_CHANNEL, PROBE_NOTICE

log = logging.getLogger("feishu_inbox.worker")

#: libpq options of the LISTEN connection unless the site gave its own: a dead peer is found
#: by TCP within ~15 s even when nothing is sent, and a connect attempt to a host that does
#: not answer gives up after 5 s (then libpq tries the next host of the string).
LISTEN_SOCKET: dict[str, Any] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
#: How long a probe may take to come back before the connection is judged deaf (a NOTIFY
#: arrives in milliseconds; this is for a machine under load).
PROBE_TIMEOUT = 10.0
#: A connection quiet this long is checked with a query.
QUIET_CHECK = 5.0
#: Waits before the next connection: after a break, and after a deaf one.
RETRY_AFTER_BROKEN = 1.0
RETRY_AFTER_DEAF = 60.0


def listen(
    connect: Callable[[], psycopg.Connection[Any]],
    *,
    wake: Callable[[str], None],
    done: threading.Event,
    listening: Callable[[bool], None],
    probe: Callable[[str], None],
) -> None:
    """Call ``wake(notice)`` for each notice until ``done``; ``listening(True)`` once a probe
    came back on a new subscription, ``listening(False)`` whenever it is lost."""
    while not done.is_set():
        pause = RETRY_AFTER_BROKEN
        try:
            with connect() as conn:
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                token = f"{PROBE_NOTICE}{secrets.token_hex(8)}"
                probe(token)
                if _heard(conn, token, wake, done):
                    log.info(
                        "wake-ups: LISTEN on %s:%s, a probe came back",
                        conn.info.host,
                        conn.info.port,
                    )
                    listening(True)
                    wake("")  # anything enqueued before we listened
                    _relay(conn, wake, done)
                elif not done.is_set():
                    log.error(
                        "LISTEN hears nothing: a probe NOTIFY sent through the default "
                        "database did not come back in %.0fs (a pooler in transaction mode "
                        "between them?). Polling every POLL_INTERVAL; set "
                        "FEISHU_INBOX['LISTEN_URL'] to a direct connection of the same "
                        "database, or POLL_ONLY (docs/production.md, PostgreSQL topology).",
                        PROBE_TIMEOUT,
                    )
                    conn.execute("UNLISTEN *")
                    pause = RETRY_AFTER_DEAF
        except (psycopg.Error, DatabaseError) as exc:
            log.warning(
                "LISTEN connection failed (%s); polling until it is back",
                str(exc).strip() or type(exc).__name__,
            )
        listening(False)
        done.wait(pause)


def _heard(
    conn: psycopg.Connection[Any], token: str, wake: Callable[[str], None], done: threading.Event
) -> bool:
    """Whether our probe comes back within PROBE_TIMEOUT (other notices are relayed)."""
    deadline = time.monotonic() + PROBE_TIMEOUT
    while not done.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        for note in conn.notifies(timeout=min(left, 1.0), stop_after=1):
            if note.payload == token:
                return True
            if not note.payload.startswith(PROBE_NOTICE):
                wake(note.payload)
    return False


def _relay(
    conn: psycopg.Connection[Any], wake: Callable[[str], None], done: threading.Event
) -> None:
    """Relay notices until ``done``; a quiet connection is checked with a query (raises
    psycopg's error when it broke)."""
    while not done.is_set():
        heard = False
        for note in conn.notifies(timeout=QUIET_CHECK, stop_after=1):
            heard = True
            if not note.payload.startswith(PROBE_NOTICE):  # other workers' probes
                wake(note.payload)
        if not heard and not done.is_set():
            conn.execute("SELECT 1")
