"""feishu_inbox.reply / send / client: Feishu's message calls as idempotent effects, against
the local fake of Feishu (tests/support/fake_feishu.py), in the ledger of the test database."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import lark_oapi
import pytest
from django.utils import timezone

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.errors import (
    ConfigurationError,
    Deferred,
    FeishuBusinessError,
    FeishuRateLimited,
    FeishuTransientError,
    InvalidMessage,
    LedgerError,
)
from feishu_inbox.models import EventJob, RateBucket
from tests.runtime.test_steps import InHandler
from tests.support.factories import EventJobFactory
from tests.support.fake_feishu import (
    BUSINESS_ERROR,
    DROP_AFTER_APPLY,
    RATE_LIMIT,
    SERVER_ERROR,
    FakeFeishu,
    Fault,
)
from tests.support.ledger_helpers import make_due, snapshot

pytestmark = pytest.mark.django_db


def message_job(fake: FakeFeishu, n: int = 1, chat: str = "oc_1") -> EventJob:
    """A message event of app "bot", whose message the fake knows to be in ``chat``."""
    fake.add_inbound(f"om_in_{n}", chat)
    return EventJobFactory(
        app="bot",
        partition_key=chat,
        payload={"event": {"message": {"message_id": f"om_in_{n}", "chat_id": chat}}},
    )


def claim_one() -> ledger.ClaimedJob:
    [claimed] = ledger.claim("w")
    return claimed


def event_of(claimed: ledger.ClaimedJob) -> feishu_inbox.Event:
    with InHandler(claimed) as ctx:
        return ctx.event


def texts(fake: FakeFeishu) -> list[str]:
    return [json.loads(m.content)["text"] for m in fake.messages]


def test_a_reply_goes_out_once_with_the_effects_key_as_its_uuid(fake_feishu: FakeFeishu) -> None:
    job = message_job(fake_feishu)
    fake_feishu.fail_next(DROP_AFTER_APPLY)  # created, then the connection drops
    first = claim_one()
    with InHandler(first), pytest.raises(FeishuTransientError):
        feishu_inbox.reply(event_of(first), "hello")
    assert EventJob.objects.get(pk=job.pk).effect_uncertain
    assert ledger.fail(first.lease, error_type="FeishuTransientError", retry_in=0) == "retry_wait"
    make_due(job.pk)
    second = claim_one()
    with InHandler(second):
        message_id = feishu_inbox.reply(event_of(second), "hello")
    assert ledger.finish(second.lease) == "completed"
    [message] = fake_feishu.messages
    assert (message.message_id, message.parent_id, message.chat_id) == (
        message_id,
        "om_in_1",
        "oc_1",
    )
    assert [r.outcome for r in fake_feishu.requests] == ["drop_after_apply", "duplicate"]
    assert {r.uuid for r in fake_feishu.requests} == {message.uuid}
    assert message.uuid is not None and message.uuid.startswith(f"fi-{job.pk}-0-")


def test_a_rate_limit_waits_for_its_reset_without_an_attempt_and_a_5xx_retries(
    fake_feishu: FakeFeishu,
) -> None:
    job = message_job(fake_feishu)
    fake_feishu.fail_next(RATE_LIMIT, SERVER_ERROR)
    first = claim_one()
    with InHandler(first), pytest.raises(Deferred) as limited:
        feishu_inbox.reply(event_of(first), "hello")
    assert 1 < limited.value.seconds <= 2  # Feishu's reset: 2 s
    assert "feishu_rate_limited" in limited.value.reason
    row = EventJob.objects.get(pk=job.pk)
    assert (row.effects_in_flight, row.effect_uncertain) == (0, False)  # nothing was sent
    (chat,) = RateBucket.objects.filter(key__contains=":chat:")
    assert chat.blocked_until is not None  # nobody takes from the chat before the reset
    assert not RateBucket.objects.get(key="feishu:bot").blocked_until
    state = ledger.hand_back(
        first.lease, delay=limited.value.seconds, error_type="RateLimited", message="wait"
    )
    assert state == "queued" and EventJob.objects.get(pk=job.pk).attempt == 0
    # the reset came, and a second after it (a blocked bucket refills from empty after it)
    RateBucket.objects.update(blocked_until=None, updated_at=timezone.now() - timedelta(seconds=1))
    make_due(job.pk)
    second = claim_one()
    with InHandler(second), pytest.raises(FeishuTransientError):
        feishu_inbox.reply(event_of(second), "hello")
    assert ledger.fail(second.lease, error_type="FeishuTransientError") == "retry_wait"
    make_due(job.pk)
    third = claim_one()
    with InHandler(third):
        feishu_inbox.reply(event_of(third), "hello")
    assert texts(fake_feishu) == ["hello"]


def test_a_refused_request_fails_the_job_with_feishus_code_and_message(
    fake_feishu: FakeFeishu,
) -> None:
    job = message_job(fake_feishu)
    fake_feishu.fail_next(BUSINESS_ERROR)
    claimed = claim_one()
    with InHandler(claimed), pytest.raises(FeishuBusinessError) as refused:
        feishu_inbox.reply(event_of(claimed), "hello")
    row = EventJob.objects.get(pk=job.pk)
    assert (row.effects_in_flight, row.effect_uncertain) == (0, False)  # nothing was sent
    assert refused.value.final and refused.value.feishu_code == 230002
    assert (
        ledger.fail(
            claimed.lease, error_type="FeishuBusinessError", message=str(refused.value), final=True
        )
        == "failed"
    )
    row = EventJob.objects.get(pk=job.pk)
    assert "230002" in row.error_message and "out of the chat" in row.error_message
    assert fake_feishu.messages == []


def test_bad_arguments_send_nothing_and_change_nothing(fake_feishu: FakeFeishu) -> None:
    job = message_job(fake_feishu)
    not_a_message = EventJobFactory(app="bot", partition_key="other", payload={"event": {}})
    claimed = claim_one()
    other = claim_one()
    before = snapshot(job.pk), snapshot(not_a_message.pk)
    with InHandler(claimed):
        with pytest.raises(LedgerError, match="longer than the remote side's window"):
            feishu_inbox.reply(event_of(claimed), "hi", idempotent_for=timedelta(hours=2))
        with pytest.raises(LedgerError, match="must be shorter than the window"):
            # Under 20 s a try (a token fetch and the request) could outlast the window.
            feishu_inbox.reply(event_of(claimed), "hi", idempotent_for=timedelta(seconds=15))
        with pytest.raises(ConfigurationError):
            feishu_inbox.send("nobody", "oc_1", "hi")
    with InHandler(other), pytest.raises(InvalidMessage, match="no message to reply to"):
        feishu_inbox.reply(event_of(other), "hi")
    assert (snapshot(job.pk), snapshot(not_a_message.pk)) == before
    with InHandler(claimed), pytest.raises(InvalidMessage):  # checked by the client: settled
        feishu_inbox.reply(event_of(claimed), "")
    assert not EventJob.objects.get(pk=job.pk).effect_uncertain
    assert fake_feishu.requests == []


def test_send_and_the_client_and_one_token_for_many_messages(fake_feishu: FakeFeishu) -> None:
    for n in range(5):
        message_job(fake_feishu, n, chat=f"oc_{n}")
    for n in range(5):
        claimed = claim_one()
        with InHandler(claimed):
            feishu_inbox.reply(event_of(claimed), f"reply {n}")
            feishu_inbox.send("bot", "ou_someone", f"dm {n}", receive_id_type="open_id")
        assert ledger.finish(claimed.lease) == "completed"
    assert sorted(texts(fake_feishu)) == sorted(
        [f"reply {n}" for n in range(5)] + [f"dm {n}" for n in range(5)]
    )
    assert len({m.uuid for m in fake_feishu.messages}) == 10
    app_id = feishu_inbox.client("bot").config.app_id
    assert isinstance(feishu_inbox.client("bot"), lark_oapi.Client)
    assert fake_feishu.token_requests(app_id) == 1


def test_a_sites_own_effect_waits_out_a_short_429_and_ends_done(
    fake_feishu: FakeFeishu,
) -> None:
    """A site that calls the Open API itself, inside its own effect: a 429 created nothing,
    so a reset within RATE_LIMIT_PATIENCE is waited out and the message sent again; the
    effect ends done, not uncertain (the job is not unknown)."""
    from feishu_inbox.feishu import openapi

    job = message_job(fake_feishu)
    fake_feishu.fail_next(Fault("rate_limit", reset_seconds=0.3))
    claimed = claim_one()
    started = time.monotonic()
    with InHandler(claimed), feishu_inbox.effect("notify"):
        openapi.send_message("bot", "oc_1", "hello", uuid=f"notify:{job.pk}")
    # The promise: the 0.3 s reset waited out, not the patience (about 0.35 s idle; patience
    # is 5 s, so a wait for it takes 5 s at least, and 4.5 s leaves room for a loaded send).
    assert 0.25 < time.monotonic() - started < 4.5
    assert [r.outcome for r in fake_feishu.requests] == ["rate_limit", "created"]
    stored = EventJob.objects.get(pk=job.pk)
    assert not stored.effect_uncertain and stored.effects_in_flight == 0
    assert ledger.finish(claimed.lease) == "completed"


def test_a_429_past_the_patience_raises_at_once(fake_feishu: FakeFeishu) -> None:
    from feishu_inbox.feishu import openapi

    fake_feishu.fail_next(Fault("rate_limit", reset_seconds=30))
    started = time.monotonic()
    with pytest.raises(FeishuRateLimited):
        openapi.send_message("bot", "oc_1", "hello", uuid="u-late")
    # The promise: at once (about 0.05 s idle), not after the 30 s reset: a third of the
    # reset tells the two apart on any load (a stress round made a plain send take 2.3 s).
    assert time.monotonic() - started < 10 and fake_feishu.messages == []
