"""Whether a database error is the database being away (``store/outages.py``): a broken
connection, or a server that is not the primary any more (SQLSTATE 25006 after a failover),
shutting down or starting up. The worker and the Feishu half try such work again on a new
connection; any other error is the statement's own (a bug, bad input) and is never retried."""

from __future__ import annotations

from ..store.outages import database_away, sqlstate

__all__ = ["database_away", "sqlstate"]
