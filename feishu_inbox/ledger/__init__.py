"""The ledger: the rules of every operation on stored work, whatever the database.

- ``rules``: one function per operation (enqueue, claim, renew, effects, steps, finish, fail,
  hand back, signals): argument checks, fencing, lease and backoff rules, results and typed
  errors. It never names a database: each operation is one transaction of the store's.
  ``fencing``: why a fenced call matched nothing, in words.
- ``operators``: the operators' actions (requeue, reconcile, discard, cancel, replay).
- ``waits``: durable waits (a wait begun, a job suspended, signals, timeouts, operators'
  resume and time out).
- ``workflows``: children spawned once and awaited, batches and chains fired once;
  ``trees``: a workflow as operators see it and act on it.
- ``turns``: conversation turns (what waits behind a turn, its membership taken once, the
  cleanups enqueued once after a job ended).
- ``kinds``: the kinds of job (Feishu events, schedule occurrences, tasks …) in one open
  registry; ``schedules``: the schedules' rows (watermark, pause, last job); ``wakeups``: how
  workers are woken (NOTIFY) and how many claims run side by side.
- ``retention``: what the ledger forgets, and when; ``stats``: what operators read.
- the database server's own state: ``outages`` (whether an error is the database being away,
  a failover's read-only session included), ``replication`` (what an acknowledged event's
  commit reached: a synchronous standby, an asynchronous one, none).
- ``retry``: retry policies, the site's and each event type's; ``idempotency``: an idempotent
  effect's key, window and margin; ``payloads``: limits on the JSON stored.
- flow control: ``limits`` (what a rate limit is), ``buckets`` (token buckets shared by every
  worker), ``concurrency`` (at most N running per key), ``pauses`` (operator pauses).
- rows of their own: ``streams`` (a streamed reply's state), ``workers`` (each worker's
  heartbeat row), ``reports`` (each gateway's channels).
- tenants (SPEC §9j): ``tenants`` (whose each job is: ``tenant=``, the tenant block,
  ``TENANT_REQUIRED``), ``credentials`` (a store app's ticket and tokens, each fetched once
  per expiry across every worker).

``feishu_inbox.ledger.enqueue(...)`` (and every other name of ``rules``) is the public way in.
This module imports ``rules`` on first use of such a name, not at import time: ``rules`` needs
the models, and ``retry``, ``idempotency`` and ``payloads`` are used by the handler API, which
``import feishu_inbox`` loads while Django is still populating its apps.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .rules import *  # noqa: F403  (the operators' actions too: rules offers them)


#: The submodules: ``from feishu_inbox.ledger import retry`` must not load ``rules``.
SUBMODULES = (
    "rules",
    "operators",
    "retention",
    "stats",
    "retry",
    "idempotency",
    "payloads",
    "kinds",
    "tenants",
    "credentials",
)


def __getattr__(name: str) -> Any:
    """A submodule, or a name of ``rules`` (``ledger.enqueue``), kept here once read."""
    if name in SUBMODULES:
        return import_module(f"{__name__}.{name}")
    rules = import_module(f"{__name__}.rules")
    try:
        value = getattr(rules, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value
