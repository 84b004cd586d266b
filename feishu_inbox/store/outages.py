"""What the database being away looks like: the errors after which the same work is tried
again on a new connection, never counted against a job (SPEC §6).

A connection that broke (Django's ``OperationalError`` or ``InterfaceError``) is one. So are
the refusals of a server that is no longer the primary, though its connection still answers:
a failover (a standby promoted, the old primary back as a standby, a pooler still pointing at
it) leaves sessions on a server that refuses every write (SQLSTATE 25006,
read_only_sql_transaction) or is shutting down or starting up (57P01-57P03). The caller closes
that connection; the next one is opened afresh, and a connection string naming every host with
``target_session_attrs=read-write`` reaches the new primary.
"""

from __future__ import annotations

from django.db import DatabaseError, InterfaceError, OperationalError

#: SQLSTATEs of a server that cannot take the ledger's writes now, whatever the statement:
#: class 08 (connection exception), 25006 (read-only transaction: a standby, or a demoted
#: primary), 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now (starting
#: up, or in recovery), 53300 too_many_connections (a pooler or server full for now).
AWAY_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03", "53300"})
AWAY_SQLSTATE_CLASSES = frozenset({"08"})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (Django's wraps the driver's: its ``__cause__``)."""
    for each in (exc, exc.__cause__):
        code = getattr(each, "sqlstate", None)
        if isinstance(code, str):
            return code
    return None


def database_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is away (tried again later, on a new connection)
    rather than that this statement is wrong (a bug, bad input: never tried again)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if not isinstance(exc, DatabaseError):
        return False
    code = sqlstate(exc)
    return code is not None and (code in AWAY_SQLSTATES or code[:2] in AWAY_SQLSTATE_CLASSES)
