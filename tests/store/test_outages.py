"""Which database errors are the database being away (tried again on a new connection, never
a job's failure) and which are the statement's own (store/outages.py)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, IntegrityError, InterfaceError, InternalError, OperationalError

from feishu_inbox.ledger.outages import database_away, sqlstate
from feishu_inbox.runtime.writes import transient

pytestmark = pytest.mark.any_database


def wrapped(django_error: type[Exception], driver: Exception) -> Exception:
    """As Django's wrapper raises a driver's error: its own class, the driver's as cause."""
    try:
        raise django_error(str(driver)) from driver
    except Exception as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "away"),
    [
        (wrapped(InternalError, psycopg.errors.ReadOnlySqlTransaction("read-only")), True),
        (wrapped(OperationalError, psycopg.errors.AdminShutdown("terminating")), True),
        (wrapped(OperationalError, psycopg.errors.CannotConnectNow("starting up")), True),
        (wrapped(DatabaseError, psycopg.errors.ConnectionFailure("gone")), True),
        (wrapped(DatabaseError, psycopg.errors.TooManyConnections("full")), True),
        (InterfaceError("connection already closed"), True),
        (wrapped(IntegrityError, psycopg.errors.UniqueViolation("dup")), False),
        (wrapped(DatabaseError, psycopg.errors.SyntaxError("bug")), False),
        (wrapped(InternalError, psycopg.errors.InFailedSqlTransaction("aborted")), False),
        (ValueError("not a database error"), False),
    ],
)
def test_the_database_away_is_told_from_a_statements_own_error(
    error: Exception, away: bool
) -> None:
    assert database_away(error) is away
    assert transient(error) is away


def test_the_sqlstate_is_read_through_djangos_wrapper() -> None:
    error = wrapped(InternalError, psycopg.errors.ReadOnlySqlTransaction("read-only"))
    assert sqlstate(error) == "25006"
    assert sqlstate(ValueError()) is None
