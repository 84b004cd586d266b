"""One connection's stores keep a chat's arrival order even when one fails or hangs: the
events after it in the chat are not stored (code 500: Feishu redelivers them), never stored
ahead of it. In process, with the ledger's store replaced by a scripted one."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

import pytest
from django.db import OperationalError

from feishu_inbox.conf import InboxSettings
from feishu_inbox.feishu import channel as connection
from feishu_inbox.feishu import inbound, protocol
from feishu_inbox.feishu.channel import Channel as Connection
from feishu_inbox.ledger.rules import EnqueueResult
from tests.support.fake_feishu_ws import event


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as pool:
        yield pool


def payload(event_id: str, chat: str) -> bytes:
    return json.dumps(event(event_id, chat_id=chat)).encode()


def run_two(
    pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch, first: str, budget: float
) -> tuple[list[int], list[str]]:
    """Events A then B of one chat (and C of another) arrive together; A's store does
    ``first`` ("fail" or "hang" past the budget). Returns their ACK codes and what was stored.

    Every store but a hanging one returns at once: the budget only bounds the wait behind
    the hanging one, and is long enough for C's store on a machine busy with other suites
    (CI once saw none of the three run within half a second)."""
    stored: list[str] = []
    release = threading.Event()

    def store(
        app: str, envelope: protocol.Envelope, keys: Any = None, **where: Any
    ) -> EnqueueResult:
        if envelope.event_id == "A":
            if first == "fail":
                raise OperationalError("the database is away")
            release.wait(30)
        stored.append(envelope.event_id)
        return EnqueueResult(job_id=len(stored), created=True)

    monkeypatch.setattr(inbound, "store", store)
    monkeypatch.setattr(connection, "close_old_connections", lambda: None)
    conf = InboxSettings(ACK_BUDGET_SECONDS=budget)
    conn = Connection(
        "main", {"APP_ID": "a", "APP_SECRET": "b", "DOMAIN": "http://127.0.0.1:9"}, conf,
        store_pool=pool,
    )  # fmt: skip

    async def arrive() -> list[int]:
        deadline = time.monotonic() + budget
        outcomes = await asyncio.gather(
            conn._event(payload("A", "oc_1"), deadline),
            conn._event(payload("B", "oc_1"), deadline),
            conn._event(payload("C", "oc_2"), deadline),
        )
        release.set()
        return [o.code for o in outcomes]

    codes = asyncio.run(arrive())
    return codes, stored


def test_after_a_failed_store_the_chats_next_event_is_not_stored(
    pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    codes, stored = run_two(pool, monkeypatch, "fail", budget=30)  # no store waits for it
    assert codes == [500, 500, 200]
    assert stored == ["C"]


def test_behind_a_store_that_hangs_the_chats_next_event_waits_and_is_not_stored(
    pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    codes, stored = run_two(pool, monkeypatch, "hang", budget=3)
    assert codes == [500, 500, 200]
    pool.shutdown(wait=True)
    assert stored[0] == "C" and "B" not in stored  # A lands late (then is a duplicate)


def test_a_card_answer_json_cannot_encode_answers_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    envelope = protocol.parse_envelope(
        {"schema": "2.0", "header": {"event_id": "e", "event_type": protocol.CARD_ACTION}}
    )
    answers: list[Any] = [
        {"toast": {"content": {1, 2}}},
        {"at": datetime(2026, 1, 1, tzinfo=timezone.utc)},
    ]
    monkeypatch.setattr(protocol, "_card_callbacks", {"*": lambda action: answers.pop(0)})
    assert inbound.answer_card("main", envelope, 2.0) == {}
    answer = inbound.answer_card("main", envelope, 2.0)
    assert json.loads(inbound.encode_answer(answer)) == {"at": "2026-01-01T00:00:00Z"}
