"""The dashboard's figures (the ledger list's dashboard page and its live JSON)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.urls import reverse

from ..ledger import buckets, pauses, reports
from ..ledger.stats import dashboard


def dashboard_data() -> dict[str, Any]:
    """The dashboard's read model (``stats.dashboard``) as JSON, with links to act."""
    board = dashboard()
    changelist = reverse("admin:feishu_inbox_eventjob_changelist")

    def job_url(job_id: int) -> str:
        return reverse("admin:feishu_inbox_eventjob_change", args=[job_id])

    return {
        **board.stats.as_dict(),
        "running": [
            {
                "id": j.pk,
                "event_type": j.event_type,
                "partition": j.partition_key,
                "worker": j.worker_id,
                "lease_until": j.lease_until.isoformat() if j.lease_until else None,
                "url": job_url(j.pk),
            }
            for j in board.running
        ],
        "blocked": [
            {
                "partition": p.key,
                "head_id": p.head_id,
                "state": p.state,
                "event_type": p.event_type,
                "error_type": p.error_type,
                "waiting": p.waiting,
                "url": job_url(p.head_id),
                "act_url": f"{changelist}?{urlencode({'status__exact': p.state, 'q': p.key})}",
            }
            for p in board.blocked
        ],
        "connections": [c.as_dict() for c in reports.seen()],
        "pauses": [pauses.as_dict(p) for p in pauses.listed()],
        "rate_limits": [b.as_dict() for b in buckets.states(limit=20)],
        "waiting_for_limits": buckets.waiting_jobs(),
        "throughput_per_minute": board.completions_per_minute,
        "generated_at": board.generated_at.isoformat(),
    }
