"""The heartbeat's renewal of a job whose own end just landed is no lost lease; a lease that
really was lost is still reported at once.

The race, seen in a worker's log: the heartbeat reads the slots, the job's finish commits, the
renewal is refused (the job is completed now) and the worker logged ``job N lost its lease``
at ERROR, telling operators to raise LEASE_SECONDS when nothing was wrong. Driven here step by
step on the worker's own heartbeat code, so the race happens every time.
"""

from __future__ import annotations

import logging
import time

import pytest

from feishu_inbox import ledger
from feishu_inbox.runtime import context
from feishu_inbox.runtime.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db


def running_job(worker: Worker, event_id: str) -> context.JobContext:
    """A job this worker claimed and runs, as its slot holds it."""
    ledger.enqueue(event_id=event_id, event_type="t.beat", partition_key=event_id, payload={})
    [claimed] = ledger.claim(worker.worker_id, lease_seconds=30)
    return worker.executor.context_for(claimed, time.monotonic())


def test_a_renewal_refused_because_the_jobs_own_finish_landed_is_not_a_lost_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = Worker(WorkerOptions(lease_seconds=30))
    ctx = running_job(worker, "ev-ending")
    ctx.ending = True  # the worker began writing its end ...
    assert ledger.finish(ctx.lease) == "completed"  # ... which landed
    with caplog.at_level(logging.DEBUG, logger="feishu_inbox"):
        worker.heartbeat.renew(ctx)  # the heartbeat had read the slots just before
    assert not ctx.lost.is_set()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_lease_really_lost_is_still_reported_at_once(caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(WorkerOptions(lease_seconds=30))
    ctx = running_job(worker, "ev-taken")
    ledger.finish(ctx.lease)  # someone else ended it: the worker was not ending it
    with caplog.at_level(logging.ERROR, logger="feishu_inbox"):
        worker.heartbeat.renew(ctx)
    assert ctx.lost.is_set()
    assert f"job {ctx.event.job_id} lost its lease" in caplog.text
