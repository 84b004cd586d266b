"""Random operation sequences against a small reference model of the state machine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from feishu_inbox import ledger
from feishu_inbox.errors import InvalidState, LeaseLost
from feishu_inbox.models import Attempt, EventJob, Partition
from tests.support.ledger_helpers import assert_mirror_consistent, expire_lease

MAX_ATTEMPTS = 2
PARTITIONS = ("a", "b", "c")


@dataclass
class ModelJob:
    id: int
    partition: str
    status: str = "queued"
    attempt: int = 0
    in_flight: int = 0
    started: bool = False
    uncertain: bool = False

    @property
    def any_effect(self) -> bool:
        return self.started or self.in_flight > 0 or self.uncertain


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Attempt.objects.all().delete()
        EventJob.objects.all().delete()
        Partition.objects.all().delete()
        self.jobs: dict[int, ModelJob] = {}
        self.keys: dict[str, int] = {}
        self.leases: dict[int, ledger.Lease] = {}  # current lease per running job
        self.stale: list[ledger.Lease] = []  # leases that were lost

    # --- the model's rules --------------------------------------------------------------

    def _head(self, partition: str) -> ModelJob | None:
        for job in sorted(self.jobs.values(), key=lambda j: j.id):
            if job.partition == partition and job.status != "completed":
                return job
        return None

    def _lease(self, index: int) -> ledger.Lease | None:
        if not self.leases:
            return None
        return sorted(self.leases.values(), key=lambda lease: lease.job_id)[
            index % len(self.leases)
        ]

    @staticmethod
    def _after_failure(job: ModelJob) -> str:
        """SPEC §3 Fail and Lease expiry: where a failed attempt leaves the job."""
        if job.any_effect:
            return "unknown"
        return "failed" if job.attempt >= MAX_ATTEMPTS else "retry_wait"

    def _end(self, lease: ledger.Lease) -> ModelJob:
        del self.leases[lease.job_id]
        self.stale.append(lease)
        return self.jobs[lease.job_id]

    @rule(key=st.integers(0, 12), partition=st.sampled_from(PARTITIONS))
    def enqueue(self, key: int, partition: str) -> None:
        result = ledger.enqueue(
            event_id=f"k{key}", event_type="t", partition_key=partition, payload={}
        )
        if f"k{key}" in self.keys:
            assert not result.created and result.job_id == self.keys[f"k{key}"]
        else:
            assert result.created
            self.keys[f"k{key}"] = result.job_id
            self.jobs[result.job_id] = ModelJob(result.job_id, partition)

    @rule(limit=st.integers(1, 3))
    def claim(self, limit: int) -> None:
        heads = [self._head(p) for p in PARTITIONS]
        claimable = sorted(
            (h for h in heads if h and h.status in ("queued", "retry_wait")), key=lambda h: h.id
        )[:limit]
        claimed = ledger.claim("w", limit=limit)
        assert [c.id for c in claimed] == [h.id for h in claimable]
        for c in claimed:
            job = self.jobs[c.id]
            job.status, job.attempt = "running", job.attempt + 1
            assert c.lease.attempt == job.attempt
            self.leases[c.id] = c.lease

    @rule(index=st.integers(0, 5))
    @precondition(lambda self: bool(self.leases))
    def begin_effect(self, index: int) -> None:
        if lease := self._lease(index):
            ledger.begin_effect(lease)
            job = self.jobs[lease.job_id]
            job.in_flight, job.started = job.in_flight + 1, True

    @rule(index=st.integers(0, 5), ok=st.booleans())
    @precondition(lambda self: bool(self.leases))
    def end_effect(self, index: int, ok: bool) -> None:
        if lease := self._lease(index):
            job = self.jobs[lease.job_id]
            if job.in_flight == 0:
                with pytest.raises(LeaseLost):
                    ledger.end_effect(lease, ok=ok)
                return
            ledger.end_effect(lease, ok=ok)
            job.in_flight -= 1
            job.uncertain = job.uncertain or not ok

    @rule(index=st.integers(0, 5), superseded=st.booleans())
    @precondition(lambda self: bool(self.leases))
    def finish(self, index: int, superseded: bool) -> None:
        if lease := self._lease(index):
            result = ledger.finish(lease, superseded=superseded)
            job = self._end(lease)
            job.status = "unknown" if job.in_flight or job.uncertain else "completed"
            assert result == job.status

    @rule(index=st.integers(0, 5))
    @precondition(lambda self: bool(self.leases))
    def fail(self, index: int) -> None:
        if lease := self._lease(index):
            result = ledger.fail(lease, error_type="Boom", retry_in=0)
            job = self._end(lease)
            job.status = self._after_failure(job)
            assert result == job.status

    @rule(index=st.integers(0, 5))
    @precondition(lambda self: bool(self.leases))
    def hand_back(self, index: int) -> None:
        if lease := self._lease(index):
            job = self.jobs[lease.job_id]
            if job.any_effect:
                with pytest.raises(InvalidState):
                    ledger.hand_back(lease)
                return
            ledger.hand_back(lease)
            self._end(lease)
            job.attempt -= 1
            job.status = "retry_wait" if job.attempt else "queued"

    @rule(index=st.integers(0, 5))
    @precondition(lambda self: bool(self.leases))
    def lease_expires(self, index: int) -> None:
        if lease := self._lease(index):
            expire_lease(lease.job_id)
            assert ledger.expire_leases() == 1
            job = self._end(lease)
            job.status = self._after_failure(job)

    @rule(index=st.integers(0, 20))
    @precondition(lambda self: bool(self.stale))
    def stale_worker_is_fenced(self, index: int) -> None:
        if self.stale:
            lease = self.stale[index % len(self.stale)]
            with pytest.raises(LeaseLost):
                ledger.begin_effect(lease)

    @rule(key=st.integers(0, 12), action=st.sampled_from(["requeue", "discard", "ok", "redo"]))
    def operator(self, key: int, action: str) -> None:
        job_id = self.keys.get(f"k{key}")
        if job_id is None:
            return
        job = self.jobs[job_id]
        if action == "requeue":
            outcome, eligible = ledger.requeue([job_id]), "failed"
        elif action == "discard":
            outcome, eligible = ledger.discard([job_id]), "failed"
        else:
            outcome = ledger.reconcile([job_id], applied=action == "ok")
            eligible = "unknown"
        if job.status != eligible:
            assert job_id in outcome.refused
            return
        assert outcome.done == [job_id]
        if action in ("discard", "ok"):
            job.status = "completed"
            job.in_flight, job.uncertain = 0, False  # settled by the operator
        else:
            job.status, job.attempt = "queued", 0
            if action == "redo":
                job.in_flight, job.started, job.uncertain = 0, False, False

    # --- the ledger must agree with the model after every step --------------------------

    @invariant()
    def matches_model(self) -> None:
        rows = {
            r["id"]: r
            for r in EventJob.objects.values(
                "id",
                "status",
                "attempt",
                "effects_in_flight",
                "side_effect_started",
                "effect_uncertain",
            )
        }
        assert set(rows) == set(self.jobs)
        for job_id, job in self.jobs.items():
            row = rows[job_id]
            assert (
                row["status"],
                row["attempt"],
                row["effects_in_flight"],
                row["side_effect_started"],
                row["effect_uncertain"],
            ) == (job.status, job.attempt, job.in_flight, job.started, job.uncertain), job
        assert_mirror_consistent()


@pytest.mark.django_db
def test_ledger_agrees_with_the_reference_model() -> None:
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": MAX_ATTEMPTS}):
        run_state_machine_as_test(
            LedgerMachine,
            settings=settings(
                max_examples=60,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
