"""``python manage.py inbox demo-data``: realistic events in every state, for a first look.

Everything goes through the ledger, as real deliveries and workers would move it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..errors import Superseded
from ..ledger import rules as ledger
from ..ledger.stats import stats

TEXTS = [
    "Can you summarise yesterday's incident?",
    "Book the big meeting room for 3pm",
    "What's our refund policy?",
    "Translate this to English please",
    "/deploy staging",
    "Who is on call this week?",
    "Remind me to send the report",
    "Thanks!",
]


def _message(chat: str, text: str, chat_type: str = "group") -> dict[str, Any]:
    now_ms = str(int(time.time() * 1000))
    return {
        "schema": "2.0",
        "header": {
            "event_id": uuid.uuid4().hex,
            "event_type": "im.message.receive_v1",
            "create_time": now_ms,
            "app_id": "cli_demo",
            "tenant_key": "demo",
        },
        "event": {
            "sender": {
                "sender_id": {"open_id": f"ou_{uuid.uuid4().hex[:10]}"},
                "sender_type": "user",
            },
            "message": {
                "message_id": f"om_{uuid.uuid4().hex}",
                "chat_id": chat,
                "chat_type": chat_type,
                "message_type": "text",
                "content": json.dumps({"text": text}),
                "create_time": now_ms,
            },
        },
    }


def _enqueue(chat: str, n: int, chat_type: str = "group") -> list[int]:
    ids = []
    for i in range(n):
        env = _message(chat, TEXTS[(len(chat) + i) % len(TEXTS)], chat_type)
        ids.append(
            ledger.enqueue(
                event_id=env["header"]["event_id"],
                event_type="im.message.receive_v1",
                dedupe_key=f"message:{env['event']['message']['message_id']}",
                partition_key=f"default:chat:{chat}",
                payload=env,
                private_message=chat_type == "p2p",
            ).job_id
        )
    return ids


def _claim_all(worker: str, lease: float = 60) -> list[ledger.ClaimedJob]:
    return ledger.claim(worker, lease_seconds=lease, limit=100)


def _reply(job: ledger.ClaimedJob, *, ok: bool) -> None:
    """What the demo bot's handler does: reply in an effect (superseded by a newer DM)."""
    try:
        ledger.begin_effect(job.lease)
    except Superseded:
        ledger.finish(job.lease, superseded=True)
        return
    ledger.end_effect(job.lease, ok=ok)
    ledger.finish(job.lease)


def fill() -> dict[str, int]:
    worker = "demo-worker-1"
    # Completed conversations.
    for c in range(6):
        _enqueue(f"oc_done_{c}", 4)
    while jobs := _claim_all(worker):
        for job in jobs:
            _reply(job, ok=True)
    # Unknown: the reply call raised; two more messages wait behind each.
    for c in range(2):
        _enqueue(f"oc_unknown_{c}", 1)
    for job in _claim_all(worker):
        _reply(job, ok=False)
    for c in range(2):
        _enqueue(f"oc_unknown_{c}", 2)
    # Failed: the LLM call kept timing out before any effect; one message waits behind each.
    for c in range(2):
        _enqueue(f"oc_failed_{c}", 1)
    while jobs := _claim_all(worker):
        for job in jobs:
            ledger.fail(
                job.lease,
                error_type="TimeoutError",
                message="LLM completion timed out after 30s",
                retry_in=0,
            )
    for c in range(2):
        _enqueue(f"oc_failed_{c}", 1)
    # Waiting to retry.
    for c in range(3):
        _enqueue(f"oc_retry_{c}", 1)
    for job in _claim_all(worker):
        ledger.fail(
            job.lease,
            error_type="ConnectionError",
            message="open.feishu.cn: connection reset",
            retry_in=900,
        )
    # Running now, on a worker with a long lease.
    for c in range(2):
        _enqueue(f"oc_busy_{c}", 2)
    _claim_all("demo-worker-2", lease=3600)
    # Queued, not yet claimed: a direct-message conversation and two groups.
    _enqueue("oc_dm_alice", 2, chat_type="p2p")
    _enqueue("oc_new_0", 3)
    _enqueue("oc_new_1", 1)
    return stats().counts
