"""Replies through real ``runworker`` processes killed with SIGKILL, against a local fake of
Feishu that dedupes by uuid and fails on purpose (issue 15): every message gets exactly one
reply, no job ends unknown, and each chat's replies keep its order; past the window a crash
inside the reply still ends unknown."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest
from django.db import connection
from django.utils import timezone

from feishu_inbox import ledger
from feishu_inbox.models import Attempt, EventJob
from tests.support.fake_feishu import FakeFeishu, Fault
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers, wait_all_completed

pytestmark = pytest.mark.django_db(transaction=True)

#: 200 messages and 6 kills once; 100 and 3 catch a reply whose uuid is not stable across
#: attempts (each apply-then-drop is then a second message) and a worker killed holding leases
#: as surely.
MESSAGES, CHATS, KILLS = 100, 10, 3


@pytest.fixture
def fake() -> Iterator[FakeFeishu]:
    with FakeFeishu(apps={"cli_reply_test": "s3cret"}) as fake:
        yield fake


def worker_env(fake: FakeFeishu) -> dict[str, str]:
    return {
        "FEISHU_APP_ID": "cli_reply_test",
        "FEISHU_APP_SECRET": "s3cret",
        "FEISHU_DOMAIN": fake.url,
        "FEISHU_INBOX_MAX_ATTEMPTS": "20",
        "FEISHU_INBOX_BACKOFF_BASE": "0.1",
        "FEISHU_INBOX_POLL_INTERVAL": "0.2",
    }


def enqueue_message(fake: FakeFeishu, n: int, chat: str, **payload: object) -> int:
    message_id = f"om_in_{n}"
    fake.add_inbound(message_id, chat)
    return ledger.enqueue(
        event_id=f"m{n}",
        event_type="test.reply",
        partition_key=chat,
        payload={
            "event": {"message": {"message_id": message_id, "chat_id": chat}},
            "text": f"reply to m{n}",
            **payload,
        },
    ).job_id


def test_a_reply_from_an_app_without_credentials_fails_at_once_with_its_fix(
    workers: Workers,
) -> None:
    """A handler replies for an app whose App ID and Secret are not set: a worker reads its
    settings when it starts, so no retry can heal it. The job fails on its first attempt, its
    code and fix recorded for the operator, instead of spending its retries (a traceback each
    time) while its chat waits."""
    job_id = ledger.enqueue(
        event_id="m-nocreds",
        event_type="test.reply",
        partition_key="oc_nocreds",
        payload={"event": {"message": {"message_id": "om_1", "chat_id": "oc_1"}}, "text": "hi"},
    ).job_id
    env = {"FEISHU_APP_ID": "", "FEISHU_APP_SECRET": "", "FEISHU_INBOX_MAX_ATTEMPTS": "5"}
    assert workers.start("--burst", **env).wait(60) == 0
    row = EventJob.objects.get(pk=job_id)
    assert (row.status, row.attempt, row.error_type) == ("failed", 1, "ConfigurationError")
    assert row.error_message.startswith("[configuration] Feishu app 'default' has no APP_ID")
    assert "Credentials page" in row.error_message  # the fix
    assert not row.side_effect_started


def test_a_reply_with_a_wrong_app_secret_fails_at_once_with_feishus_code_and_the_fix(
    workers: Workers, fake: FakeFeishu
) -> None:
    """Feishu's Open API refuses the app's credentials (the token call's non-zero code): no
    retry can heal it, so the job fails on its first attempt with Feishu's code and the fix
    (issue 55), as the admin and ``inbox show`` then show it."""
    job_id = enqueue_message(fake, 1, "oc_wrongsecret")
    env = {
        **worker_env(fake),
        "FEISHU_APP_SECRET": "not-the-secret",
        "FEISHU_INBOX_MAX_ATTEMPTS": "5",
    }
    proc = workers.start("--burst", **env)
    assert proc.wait(60) == 0, workers.stderr(proc)
    row = EventJob.objects.get(pk=job_id)
    assert (row.status, row.attempt, row.error_type) == ("failed", 1, "FeishuBusinessError")
    assert row.error_message.startswith("[feishu_business] Could not get a tenant access token")
    assert "Credentials page" in row.error_message  # the fix
    assert not fake.messages


def test_replies_through_killed_workers_each_go_out_once_in_order(
    workers: Workers, fake: FakeFeishu
) -> None:
    fake.fail_first_tries(0.2, seed=15)  # apply-then-drop, 429 with a reset, or 500
    order: dict[str, list[str]] = defaultdict(list)
    for n in range(MESSAGES):
        chat = f"oc_chat_{n % CHATS}"
        enqueue_message(fake, n, chat, think=0.02)
        order[chat].append(f"reply to m{n}")
    env = worker_env(fake)
    args = ("--concurrency", "4", "--lease-seconds", "2")
    procs = [workers.start(*args, **env) for _ in range(2)]
    for k in range(KILLS):  # a kill each time another 25 replies went out
        wait_for(lambda k=k: len(fake.messages) >= 25 * (k + 1), 120, f"{25 * (k + 1)} replies")
        victim = procs[k % 2]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        procs[k % 2] = workers.start(*args, **env)

    wait_all_completed(MESSAGES, 180, lambda: workers.stderr(procs[0]))

    # Exactly one reply per message, in each chat in the order of its messages.
    replies = Counter(m.parent_id for m in fake.messages)
    assert replies == {f"om_in_{n}": 1 for n in range(MESSAGES)}
    by_chat: dict[str, list[str]] = defaultdict(list)
    for m in sorted(fake.messages, key=lambda m: m.seq):
        assert m.chat_id is not None
        by_chat[m.chat_id].append(json.loads(m.content)["text"])
    assert by_chat == order

    # It was not a calm run: faults on first tries were re-sent with their uuid and deduped,
    # workers died holding leases, and each worker process fetched its token once.
    counts = fake.counts()
    assert counts["drop_after_apply"] and counts["rate_limit"] and counts["server_error"]
    assert counts["duplicate"] >= counts["drop_after_apply"]
    expired = Attempt.objects.filter(error_type="LeaseExpired").count()
    assert expired >= 1
    assert fake.token_requests("cli_reply_test") <= len(workers.procs)
    assert not Attempt.objects.filter(outcome="unknown").exists()


def test_past_the_window_a_crash_inside_the_reply_ends_unknown(
    workers: Workers, fake: FakeFeishu
) -> None:
    # The reply is created, then the answer hangs: the worker dies inside the effect.
    fake.fail_next(Fault("slow_after_apply", delay=15))
    job_id = enqueue_message(fake, 1, "oc_chat", window=3, margin=1)
    env = worker_env(fake)
    proc = workers.start("--lease-seconds", "2", **env)
    wait_for(lambda: fake.requests, 60, "the reply request")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)

    def window_passed() -> bool:
        connection.close()
        until = EventJob.objects.get(pk=job_id).idempotent_until
        return until is not None and until < timezone.now()

    wait_for(window_passed, 10, "the window (3 s less 1 s) to pass")
    workers.start("--lease-seconds", "2", **env)  # its claims recover the expired lease
    wait_for(lambda: EventJob.objects.get(pk=job_id).status != "running", 30, "lease expiry")
    job = EventJob.objects.get(pk=job_id)
    assert (job.status, job.error_type) == ("unknown", "LeaseExpiredAfterSideEffect")
    assert len(fake.messages) == 1 and len(fake.requests) == 1  # never re-sent


def test_the_demo_bot_replies_through_feishu_when_it_has_credentials(
    workers: Workers, fake: FakeFeishu
) -> None:
    from project.demo.models import Reply

    fake.add_inbound("om_demo", "oc_demo")
    ledger.enqueue(
        event_id="ev-demo",
        event_type="im.message.receive_v1",
        partition_key="default:chat:oc_demo",
        payload={
            "event": {
                "message": {
                    "message_id": "om_demo",
                    "chat_id": "oc_demo",
                    "content": json.dumps({"text": "ping"}),
                }
            }
        },
    )
    proc = workers.start("--burst", **worker_env(fake))
    assert proc.wait(60) == 0, workers.stderr(proc)
    assert [json.loads(m.content)["text"] for m in fake.messages] == ["You said: ping"]
    assert fake.messages[0].parent_id == "om_demo"
    assert not Reply.objects.exists()  # the rows are for a bot without credentials
    assert EventJob.objects.get(event_id="ev-demo").status == "completed"
