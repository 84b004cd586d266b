"""Streamed replies (feishu_inbox.stream_reply / stream_send), in the ledger of the test
database, against the fake Open API's CardKit (tests/support/fake_cardkit.py), whose rules are
shown first to be what lark-oapi's own client sees."""

from __future__ import annotations

import asyncio
import itertools
import json
from concurrent.futures import ThreadPoolExecutor

import lark_oapi
import pytest
from django.db import connections
from lark_oapi.api.cardkit.v1 import (
    Card,
    ContentCardElementRequest,
    ContentCardElementRequestBody,
    CreateCardRequest,
    CreateCardRequestBody,
    SettingsCardRequest,
    SettingsCardRequestBody,
    UpdateCardRequest,
    UpdateCardRequestBody,
)
from lark_oapi.api.im.v1 import ReplyMessageRequest, ReplyMessageRequestBody

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.errors import Deferred, InvalidMessage, LeaseLost
from feishu_inbox.feishu import streams
from feishu_inbox.models import CardStream, EventJob
from tests.feishu.test_replies import claim_one, message_job
from tests.runtime.test_steps import InHandler
from tests.support.fake_cardkit import Card as FakeCard
from tests.support.fake_feishu import DROP_AFTER_APPLY, FakeFeishu, Fault
from tests.support.ledger_helpers import expire_lease, make_due

pytestmark = pytest.mark.django_db

WORDS = [f"word{i} " for i in range(30)]
ANSWER = "".join(WORDS)


def sdk(fake: FakeFeishu) -> lark_oapi.Client:
    app_id, secret = next(iter(fake.apps.items()))
    return lark_oapi.Client.builder().app_id(app_id).app_secret(secret).domain(fake.url).build()


def card_json(text: str = "", streaming: bool = True) -> str:
    return json.dumps(
        {
            "schema": "2.0",
            "config": {"streaming_mode": streaming},
            "body": {"elements": [{"tag": "markdown", "content": text, "element_id": "md"}]},
        }
    )


def stream_text(client: lark_oapi.Client, card_id: str, text: str, seq: int, uuid: str) -> int:
    body = ContentCardElementRequestBody.builder().content(text).sequence(seq).uuid(uuid).build()
    request = (
        ContentCardElementRequest.builder()
        .card_id(card_id)
        .element_id("md")
        .request_body(body)
        .build()
    )
    response = client.cardkit.v1.card_element.content(request)
    return int(response.code)


def test_the_fake_cardkit_speaks_to_lark_oapis_client_with_feishus_rules(
    fake_feishu: FakeFeishu,
) -> None:
    client = sdk(fake_feishu)
    created = client.cardkit.v1.card.create(
        CreateCardRequest.builder()
        .request_body(CreateCardRequestBody.builder().type("card_json").data(card_json()).build())
        .build()
    )
    assert created.success(), created.msg
    card_id = created.data.card_id
    assert stream_text(client, card_id, "Hel", 1, "u1") == 0
    assert stream_text(client, card_id, "Hel", 1, "u1") == 0  # the same uuid and body: harmless
    assert stream_text(client, card_id, "Hello", 1, "u2") == 300317  # sequence not increasing
    assert stream_text(client, card_id, "Help", 2, "u1") == 200770  # a uuid with another body
    assert stream_text(client, "7000", "x", 9, "u3") == 200740  # no such card
    assert stream_text(client, card_id, "Hello", 2, "u4") == 0

    # the card goes out in one message, once
    fake_feishu.add_inbound("om_q", "oc_1")
    content = json.dumps({"type": "card", "data": {"card_id": card_id}})

    def reply(uuid: str) -> int:
        body = {"msg_type": "interactive", "content": content, "uuid": uuid}
        request = (
            ReplyMessageRequest.builder()
            .message_id("om_q")
            .request_body(ReplyMessageRequestBody(body))
            .build()
        )
        return int(client.im.v1.message.reply(request).code)

    assert reply("r1") == 0 and reply("r1") == 0  # the repeat is the first message
    assert reply("r2") == 230099  # a card entity is sent once
    [message] = fake_feishu.messages
    assert message.card_id == card_id

    settings = json.dumps({"config": {"streaming_mode": False}})
    closed = client.cardkit.v1.card.settings(
        SettingsCardRequest.builder()
        .card_id(card_id)
        .request_body(
            SettingsCardRequestBody.builder().settings(settings).sequence(3).uuid("u5").build()
        )
        .build()
    )
    assert closed.success(), closed.msg
    assert stream_text(client, card_id, "Hello!", 4, "u6") == 300309  # streaming is off
    updated = client.cardkit.v1.card.update(
        UpdateCardRequest.builder()
        .card_id(card_id)
        .request_body(
            UpdateCardRequestBody.builder()
            .card(Card.builder().type("card_json").data(card_json("Hello!", False)).build())
            .sequence(5)
            .uuid("u7")
            .build()
        )
        .build()
    )
    assert updated.success(), updated.msg
    card = fake_feishu.cardkit.cards[card_id]
    assert card.texts("md") == ["Hel", "Hello", "Hello!"]
    assert not card.streaming

    # more than 10 operations in a second: 429 with the reset
    for seq in range(6, 20):
        code = stream_text(client, card_id, "x", seq, f"r-{seq}")
        if code != 300309:
            break
    assert code == 99991400
    assert card.most_in_a_second() > 10


def test_the_streaming_window_closes_by_itself(fake_feishu: FakeFeishu) -> None:
    client = sdk(fake_feishu)
    created = client.cardkit.v1.card.create(
        CreateCardRequest.builder()
        .request_body(CreateCardRequestBody.builder().type("card_json").data(card_json()).build())
        .build()
    )
    card = fake_feishu.cardkit.cards[created.data.card_id]
    card.streaming_on_at -= fake_feishu.cardkit.stream_window  # ten minutes later
    assert stream_text(client, card.card_id, "late", 1, "a") == 200850  # timed out
    assert stream_text(client, card.card_id, "late", 2, "b") == 300309  # and closed


# --- stream_reply in the ledger -----------------------------------------------------------------


def the_card(fake: FakeFeishu) -> FakeCard:
    [message] = fake.messages
    assert message.card_id is not None
    return fake.cardkit.cards[message.card_id]


def assert_never_went_back(card: FakeCard, marker: str = streams.DEFAULT_MARKER) -> None:
    texts = [t.removesuffix(marker) for t in card.texts(streams.ELEMENT_ID)]
    for before, after in itertools.pairwise(texts):
        assert after.startswith(before), (before, after)


def test_a_streamed_reply_is_one_card_in_one_message_with_the_whole_answer(
    fake_feishu: FakeFeishu,
) -> None:
    job = message_job(fake_feishu)
    claimed = claim_one()
    with InHandler(claimed) as ctx, feishu_inbox.stream_reply(ctx.event, title="Bot") as card:
        for word in WORDS:
            card.write(word)
    assert ledger.finish(claimed.lease) == "completed"
    [message] = fake_feishu.messages
    assert (message.msg_type, message.parent_id) == ("interactive", "om_in_1")
    shown = the_card(fake_feishu)
    assert shown.elements[streams.ELEMENT_ID] == ANSWER
    assert not shown.streaming and shown.data["header"]["title"]["content"] == "Bot"
    # written at once: coalesced into the final update (then streaming off)
    assert [r.operation for r in fake_feishu.cardkit.requests] == ["create", "content", "settings"]
    row = CardStream.objects.get(job_id=job.pk)
    assert (row.card_id, row.message_id, row.sequence, row.text) == (
        shown.card_id,
        message.message_id,
        2,
        ANSWER,
    )
    assert row.closed and not row.streaming
    # the card, its message, then one write per operation (the reply effect writes its own)
    assert card.operations == 2 and card.ledger_writes == 4


def test_a_retry_resumes_the_same_card_after_the_text_it_showed(
    fake_feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "TRANSIENT_WAITS", (0.01,) * 3)
    job = message_job(fake_feishu)
    first = claim_one()
    with InHandler(first) as ctx:
        stream = feishu_inbox.stream_reply(ctx.event)
        card = stream.__enter__()
        for word in WORDS[:10]:
            card.write(word)
        card.flush()
        # the next update is recorded and sent, and no answer ever comes: sent again with
        # its sequence and uuid (harmless: applied once), three times, then the attempt fails
        fake_feishu.fail_next(*[DROP_AFTER_APPLY] * 4, endpoint="card")
        card.write(WORDS[10])
        with pytest.raises(Exception, match=r"(?i)stream into card"):
            card.flush()
    expire_lease(job.pk)
    assert ledger.expire_leases() == 1 and EventJob.objects.get(pk=job.pk).status == "retry_wait"
    make_due(job.pk)
    second = claim_one()
    with InHandler(second) as ctx, feishu_inbox.stream_reply(ctx.event) as card:
        assert card.seen == "".join(WORDS[:11])  # at least what the user saw
        for word in WORDS:
            card.write(word)  # the memoized answer, written again
    assert ledger.finish(second.lease) == "completed"
    shown = the_card(fake_feishu)
    assert shown.elements[streams.ELEMENT_ID] == ANSWER and not shown.streaming
    assert len(fake_feishu.cardkit.cards) == 1  # the same card
    assert_never_went_back(shown)
    outcomes = fake_feishu.cardkit.outcomes()
    assert "sequence_refused" not in outcomes and "uuid_reused" not in outcomes


def test_an_exception_closes_the_card_with_the_marker_and_a_retry_goes_on(
    fake_feishu: FakeFeishu,
) -> None:
    job = message_job(fake_feishu)
    first = claim_one()
    with (
        InHandler(first) as ctx,
        pytest.raises(ValueError),
        feishu_inbox.stream_reply(ctx.event, marker=" [cut]") as card,
    ):
        card.write("Half an ans")
        raise ValueError("the model's connection dropped")
    shown = the_card(fake_feishu)
    assert shown.elements[streams.ELEMENT_ID] == "Half an ans [cut]" and not shown.streaming
    assert ledger.fail(first.lease, error_type="ValueError", retry_in=0) == "retry_wait"
    make_due(job.pk)
    second = claim_one()
    with InHandler(second) as ctx, feishu_inbox.stream_reply(ctx.event, marker=" [cut]") as card:
        card.write("Half an answer, whole.")
    assert ledger.finish(second.lease) == "completed"
    assert shown.elements[streams.ELEMENT_ID] == "Half an answer, whole." and not shown.streaming
    assert_never_went_back(shown, " [cut]")
    assert len(fake_feishu.messages) == 1


def test_past_the_streaming_window_the_answer_ends_in_a_whole_card_update(
    fake_feishu: FakeFeishu,
) -> None:
    message_job(fake_feishu)
    claimed = claim_one()
    with InHandler(claimed) as ctx, feishu_inbox.stream_reply(ctx.event) as card:
        card.write("Before ")
        card.flush()
        the_card(fake_feishu).streaming_on_at -= fake_feishu.cardkit.stream_window
        card.write("and after ten minutes.")
        card.flush()
        card.write(" The end.")
    assert ledger.finish(claimed.lease) == "completed"
    shown = the_card(fake_feishu)
    assert shown.elements[streams.ELEMENT_ID] == "Before and after ten minutes. The end."
    assert not shown.streaming
    operations = [(r.operation, r.outcome) for r in fake_feishu.cardkit.requests]
    assert ("content", "timed_out") in operations and ("update", "applied") in operations
    assert_never_went_back(shown)


def test_a_card_rate_limit_is_waited_out_with_the_same_operation(fake_feishu: FakeFeishu) -> None:
    message_job(fake_feishu)
    claimed = claim_one()
    fake_feishu.fail_next(Fault("rate_limit", reset_seconds=0.2), endpoint="card")  # the create
    with InHandler(claimed) as ctx, feishu_inbox.stream_reply(ctx.event) as card:
        card.write(ANSWER)
    assert ledger.finish(claimed.lease) == "completed"
    assert the_card(fake_feishu).elements[streams.ELEMENT_ID] == ANSWER
    assert [r.outcome for r in fake_feishu.cardkit.requests][:2] == ["rate_limit", "created"]


def test_a_lost_lease_sends_nothing_more(fake_feishu: FakeFeishu) -> None:
    job = message_job(fake_feishu)
    claimed = claim_one()
    with InHandler(claimed) as ctx:
        stream = feishu_inbox.stream_reply(ctx.event)
        card = stream.__enter__()
        requests = len(fake_feishu.cardkit.requests)
        expire_lease(job.pk)
        card.write("too late")
        with pytest.raises(LeaseLost):
            card.flush()
        stream.__exit__(LeaseLost, LeaseLost("lost"), None)  # nothing written, nothing sent
    assert len(fake_feishu.cardkit.requests) == requests


@pytest.mark.django_db(transaction=True)  # the ledger's calls run on other threads
def test_an_async_handler_streams_with_async_with(fake_feishu: FakeFeishu) -> None:
    message_job(fake_feishu)
    claimed = claim_one()

    async def handler(event: feishu_inbox.Event) -> None:
        # one executor thread, whose connection is closed at the end
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        try:
            async with feishu_inbox.stream_reply(event) as card:
                for word in WORDS:
                    await card.write(word)
        finally:
            await asyncio.to_thread(connections.close_all)

    with InHandler(claimed) as ctx:
        asyncio.run(handler(ctx.event))
    assert ledger.finish(claimed.lease) == "completed"
    assert the_card(fake_feishu).elements[streams.ELEMENT_ID] == ANSWER


def test_bad_arguments_are_refused_before_any_request(fake_feishu: FakeFeishu) -> None:
    message_job(fake_feishu)
    claimed = claim_one()
    with InHandler(claimed) as ctx:
        with pytest.raises(InvalidMessage, match="interval"):
            feishu_inbox.stream_reply(ctx.event, interval=0)
        with pytest.raises(InvalidMessage, match="name"):
            feishu_inbox.stream_reply(ctx.event, name="")
        no_message = feishu_inbox.Event(**{**ctx.event.__dict__, "payload": {}})
        with pytest.raises(InvalidMessage, match="no message to reply to"):
            feishu_inbox.stream_reply(no_message)
        assert not fake_feishu.cardkit.requests and not fake_feishu.messages
        with feishu_inbox.stream_reply(ctx.event) as card, pytest.raises(TypeError):
            card.write(42)  # type: ignore[arg-type]
    assert card.text == "" and len(fake_feishu.messages) == 1


def test_stream_send_starts_a_new_message_in_a_chat(fake_feishu: FakeFeishu) -> None:
    job = message_job(fake_feishu)
    claimed = claim_one()
    with (
        InHandler(claimed),
        feishu_inbox.stream_send("bot", "oc_other", summary="Thinking") as card,
    ):
        card.write("A new ")
        card.flush()
        card.set("A new message.")
    assert ledger.finish(claimed.lease) == "completed"
    [message] = fake_feishu.messages
    assert (message.kind, message.chat_id, message.parent_id) == ("send", "oc_other", None)
    shown = the_card(fake_feishu)
    assert shown.elements[streams.ELEMENT_ID] == "A new message." and not shown.streaming
    assert shown.data["config"]["summary"] == {"content": "Thinking"}
    assert_never_went_back(shown)
    assert CardStream.objects.get(job_id=job.pk).message_id == message.message_id


def test_a_long_card_rate_limit_hands_the_job_back_and_it_resumes(
    fake_feishu: FakeFeishu,
) -> None:
    job = message_job(fake_feishu)
    first = claim_one()
    with InHandler(first) as ctx:
        stream = feishu_inbox.stream_reply(ctx.event)
        card = stream.__enter__()
        card.write("Some")
        fake_feishu.fail_next(Fault("rate_limit", reset_seconds=30), endpoint="card")
        with pytest.raises(Deferred) as deferred:
            card.flush()
        stream.__exit__(Deferred, deferred.value, None)  # no marker: it resumes soon
    assert 29 < deferred.value.seconds <= 30
    state = ledger.hand_back(first.lease, delay=0, error_type="RateLimited", message="wait")
    assert state == "queued" and EventJob.objects.get(pk=job.pk).attempt == 0
    second = claim_one()
    with InHandler(second) as ctx, feishu_inbox.stream_reply(ctx.event) as card:
        card.write("Some text.")
    assert ledger.finish(second.lease) == "completed"
    shown = the_card(fake_feishu)
    assert shown.elements[streams.ELEMENT_ID] == "Some text." and not shown.streaming
    assert len(fake_feishu.messages) == 1
