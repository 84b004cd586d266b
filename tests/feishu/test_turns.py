"""Conversation turns (SPEC §9g) in the ledger and the handler API, on both databases: a turn's
membership taken once (fenced, all or nothing), the burst's rules, cleanups enqueued once after
their job ended, Feishu's messages read, bad configuration refused, and the fake Open API's
reactions proven against the official SDK. tests/feishu/test_turn_workers.py proves the rest
on real workers, killed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import lark_oapi
import pytest
from django.urls import reverse
from lark_oapi.api.im.v1 import (
    CreateMessageReactionRequest,
    CreateMessageReactionRequestBody,
    DeleteMessageReactionRequest,
    ListMessageReactionRequest,
)

import feishu_inbox
from feishu_inbox import ledger, telemetry
from feishu_inbox.errors import Concluded, ConfigurationError, Deferred, LeaseLost, LedgerError
from feishu_inbox.feishu.turns import FeishuMessages, stop_click, stop_value
from feishu_inbox.ledger import turns as ledger_turns
from feishu_inbox.models import EventJob, Status, Step
from feishu_inbox.runtime import attempts, cleanups, registry, turns
from feishu_inbox.tables.turns import TurnCleanup
from tests.admin.test_admin import CHANGELIST, staff
from tests.runtime.test_steps import InHandler
from tests.support.fake_feishu import FakeFeishu
from tests.support.fake_feishu_ws import card_action
from tests.support.feishu_client import message_event
from tests.support.ledger_helpers import expire_lease
from tests.workflows.test_workflows import claim_job

pytestmark = pytest.mark.django_db

CHAT = "default:chat:oc_unit"
READER = FeishuMessages()


def say(text: str, *, chat: str = CHAT, event_type: str = "im.message.receive_v1") -> int:
    envelope = message_event(chat_id=chat.rsplit(":", 1)[-1], text=text)
    return ledger.enqueue(
        event_id=envelope["header"]["event_id"],
        event_type=event_type,
        partition_key=chat,
        payload=envelope,
    ).job_id


def recall(job_id: int) -> int:
    message_id = EventJob.objects.get(pk=job_id).payload["event"]["message"]["message_id"]
    envelope = message_event(chat_id="oc_unit")
    envelope["event"] = {"message_id": message_id, "chat_id": "oc_unit"}
    return ledger.enqueue(
        event_id=envelope["header"]["event_id"],
        event_type="im.message.recalled_v1",
        partition_key=CHAT,
        payload=envelope,
    ).job_id


def begin(job_id: int, spec: turns.Coalesce, deadline: Any = None) -> Any:
    """Form the turn of ``job_id`` as the executor does: (outcome, turn or exception)."""
    claimed = claim_job(job_id)
    with InHandler(claimed) as ctx:
        try:
            turns.begin(ctx, spec, deadline)
        except Deferred as wait:
            attempts.defer(ctx, wait)  # as the executor does: back, no attempt spent
            assert EventJob.objects.get(pk=job_id).attempt == 0
            return "Deferred", wait
        except Concluded as stopped:
            ledger.finish(claimed.lease, note=stopped.note)  # as the executor does
            return type(stopped).__name__, stopped
        return "turn", ctx.event.turn


NOW = turns.Coalesce(quiet=0.0, max_wait=0.0)


def test_a_burst_becomes_one_turn_whose_members_end_coalesced_and_whose_record_holds() -> None:
    first = say("hi")
    rest = [say("can you"), say("summarise it")]
    outcome, turn = begin(first, NOW)
    assert outcome == "turn" and turn.text == "hi\ncan you\nsummarise it"
    assert [m.job_id for m in turn.messages] == [first, *rest]
    assert turn.last.job_id == rest[-1]
    for job in EventJob.objects.filter(pk__in=rest):
        assert (job.status, job.error_type) == (Status.COMPLETED, "Coalesced")
        assert job.error_message == f"Taken into the turn of job {first}."
    recorded = Step.objects.get(job_id=first, name=turns.MEMO).result
    recorded = json.loads(recorded) if isinstance(recorded, str) else recorded
    assert [m["job_id"] for m in recorded["messages"]] == [first, *rest]


def test_the_quiet_window_hands_the_turn_back_without_an_attempt() -> None:
    first = say("hi")
    outcome, wait = begin(first, turns.Coalesce(quiet=30.0, max_wait=60.0))
    assert outcome == "Deferred" and 29 < wait.seconds <= 30
    # full: 2 messages at max_messages=2 form at once, quiet or not
    full_chat = "default:chat:oc_full"
    head = say("one", chat=full_chat)
    say("two", chat=full_chat)
    outcome, turn = begin(head, turns.Coalesce(quiet=30.0, max_wait=60.0, max_messages=2))
    assert outcome == "turn" and len(turn.messages) == 2


def test_limits_and_another_event_end_a_burst_and_stop_commands_stop_it() -> None:
    first = say("a" * 10)
    second = say("b" * 10)
    say("c" * 10)  # past max_chars: the next turn's
    outcome, turn = begin(first, turns.Coalesce(quiet=0, max_wait=0, max_chars=25))
    assert [m.job_id for m in turn.messages] == [first, second]

    other_chat = "default:chat:oc_other"
    head = say("x", chat=other_chat)
    say("card", chat=other_chat, event_type="card.action.trigger")
    say("y", chat=other_chat)  # behind another event: not taken out of the chat's order
    outcome, turn = begin(head, NOW)
    assert len(turn.messages) == 1

    stopped_chat = "default:chat:oc_stop"
    head = say("do this", chat=stopped_chat)
    stop = say("/stop", chat=stopped_chat)
    outcome, why = begin(head, NOW)
    assert outcome == "Concluded" and why.note == "Stopped"
    assert EventJob.objects.get(pk=stop).error_type == "Coalesced"


def test_recalled_messages_leave_the_turn_and_a_turn_of_only_recalled_ones_ends_recalled() -> None:
    first, second = say("never mind"), say("answer this")
    recall(first)
    outcome, turn = begin(first, NOW)
    assert [m.text for m in turn.live] == ["answer this"] and turn.last.job_id == second

    lonely_chat = "default:chat:oc_lonely"
    only = say("oops", chat=lonely_chat)
    message_id = EventJob.objects.get(pk=only).payload["event"]["message"]["message_id"]
    envelope = message_event(chat_id="oc_lonely")
    envelope["event"] = {"message_id": message_id, "chat_id": "oc_lonely"}
    ledger.enqueue(
        event_id="recall-lonely",
        event_type="im.message.recalled_v1",
        partition_key=lonely_chat,
        payload=envelope,
    )
    outcome, why = begin(only, NOW)
    assert outcome == "Concluded" and why.note == "Recalled"


def test_a_take_is_all_or_nothing_and_fenced() -> None:
    first, second, third = say("a"), say("b"), say("c")
    claimed = claim_job(first)
    ledger.cancel([third])  # an operator ended one meanwhile
    with pytest.raises(ledger_turns.TurnChanged):
        ledger_turns.take(claimed.lease, members=[second, third], memo="turn", value={})
    assert EventJob.objects.get(pk=second).status == Status.QUEUED  # nothing changed
    assert not Step.objects.filter(job_id=first).exists()
    expire_lease(first)
    ledger.expire_leases()
    with pytest.raises(LeaseLost):
        ledger_turns.take(claimed.lease, members=[second], memo="turn", value={})
    assert EventJob.objects.get(pk=second).status == Status.QUEUED


def test_a_recorded_turn_is_the_turn_of_every_later_attempt() -> None:
    first, second = say("a"), say("b")
    claimed = claim_job(first)
    with InHandler(claimed) as ctx:
        turns.begin(ctx, NOW, None)
    late = say("c")
    ledger.hand_back(claimed.lease)  # (the first attempt died; a second one runs)
    _, turn = begin(first, NOW)
    assert [m.job_id for m in turn.messages] == [first, second]  # not the later message
    assert EventJob.objects.get(pk=late).status == Status.QUEUED


def test_a_late_message_is_skipped_or_noticed_and_an_on_time_one_runs() -> None:
    envelope = message_event(chat_id="oc_late", text="this morning")
    envelope["event"]["message"]["create_time"] = str(0)  # 1970: very late
    late = ledger.enqueue(
        event_id="late", event_type="im.message.receive_v1", partition_key="late", payload=envelope
    ).job_id
    deadline = turns.StartDeadline.of(timedelta(minutes=30), "skip", "sorry")
    outcome, why = begin(late, NOW, deadline)
    assert outcome == "Concluded" and why.note == "Stale"
    on_time = say("now")
    outcome, _ = begin(on_time, NOW, deadline)
    assert outcome == "turn"


def counted(start: str) -> float:
    """The turns counted so far that started so (``feishu_inbox_turns_total``)."""
    value = telemetry.TURNS.labels("im.message.receive_v1", start)._value.get()
    return float(value)


def test_a_late_start_is_counted_by_its_policy_and_found_in_the_admin_by_how_it_ended() -> None:
    """Every policy leaves a trace: a skipped or noticed message ends ``Stale`` (the admin's
    "ended as" filter finds it, and only it) and counts ``start="stale"``; one run anyway
    counts ``start="late"``, not ``run``; an on-time one counts ``run``."""

    def old_message(event_id: str, chat: str) -> int:
        envelope = message_event(chat_id=chat, text="sent this morning")
        envelope["event"]["message"]["create_time"] = str(0)
        return ledger.enqueue(
            event_id=event_id,
            event_type="im.message.receive_v1",
            partition_key=f"default:chat:{chat}",
            payload=envelope,
        ).job_id

    before = {start: counted(start) for start in ("stale", "late", "run")}
    skipped = old_message("late-skip", "oc_skip")
    outcome, _ = begin(skipped, NOW, turns.StartDeadline.of(timedelta(minutes=30), "skip", "-"))
    assert outcome == "Concluded"
    ran = old_message("late-run", "oc_run")
    outcome, turn = begin(ran, NOW, turns.StartDeadline.of(timedelta(minutes=30), "run", "-"))
    assert outcome == "turn" and turn.text == "sent this morning"
    on_time = say("just now")
    outcome, _ = begin(on_time, NOW, turns.StartDeadline.of(timedelta(minutes=30), "run", "-"))
    assert outcome == "turn"
    assert {start: counted(start) - before[start] for start in before} == {
        "stale": 1,
        "late": 1,
        "run": 1,
    }

    operator = staff("turns-operator", "view_eventjob")
    page = operator.get(reverse(CHANGELIST), {"ended_as": "Stale"})
    assert page.status_code == 200
    listed = {row.pk for row in page.context["cl"].result_list}
    assert listed == {skipped}
    assert "Stale: past its stale_after" in page.content.decode()
    everything = operator.get(reverse(CHANGELIST), {"ended_as": "no such ending"})
    assert everything.status_code == 200  # an unknown value filters nothing, refuses nothing
    assert {skipped, ran, on_time} <= {row.pk for row in everything.context["cl"].result_list}


def test_a_removal_after_an_attempt_that_may_still_add_leaves_a_late_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn's reaction removal leaves a second, late one only when an attempt of the turn
    ended while its thread could still be sending the add (timed out, lease expired), within
    the add's window; the late one waits until then without spending an attempt."""
    from django.utils import timezone

    from feishu_inbox.feishu import turns as feishu_turns
    from feishu_inbox.models import Attempt

    removed: list[str] = []
    monkeypatch.setattr(
        feishu_turns,
        "remove_reactions",
        lambda app, message_id, emoji: removed.append(message_id) or 0,
    )
    turn_job = say("hello")

    def remove(n: int, **extra: Any) -> Any:
        """Run removal job ``n`` of the turn's reaction; the cleanups it left behind."""
        payload = {"message_id": "om_typing", "emoji": "Typing", "job": turn_job, **extra}
        job_id = ledger.enqueue(
            event_id=f"removal-{n}",
            event_type=feishu_turns.REMOVE_REACTION,
            partition_key=f"wf:~removal-{n}",
            payload=payload,
        ).job_id
        with InHandler(claim_job(job_id)) as ctx:
            try:
                feishu_turns._remove_job(ctx.event)
            except Deferred as wait:
                return wait
        return [c.spec["payload"] for c in TurnCleanup.objects.filter(job_id=job_id)]

    def ended(error_type: str, seconds_ago: float) -> None:
        at = timezone.now() - timedelta(seconds=seconds_ago)
        Attempt.objects.create(
            job_id=turn_job,
            number=1,
            worker_id="w",
            started_at=at,
            ended_at=at,
            outcome=Status.FAILED,
            error_type=error_type,
            error_message="",
            lease_token="t",
        )

    window = feishu_turns.add_window()
    ended("ValueError", 1)  # its thread raised it: it sends nothing more
    assert remove(1) == [] and removed == ["om_typing"]
    ended("TimedOut", 2 * window)  # abandoned long ago: its add landed or never will
    assert remove(2) == []
    ended("LeaseExpired", 1)
    [late] = remove(3)
    assert late["message_id"] == "om_typing" and late["job"] == turn_job
    assert window - 10 < late["not_before"] - time.time() <= window
    assert len(removed) == 3
    wait = remove(4, not_before=late["not_before"])
    assert isinstance(wait, Deferred) and window - 10 < wait.seconds <= window
    assert len(removed) == 3  # it waits before it removes anything
    assert remove(5, not_before=time.time() - 1) == [] and len(removed) == 4


def shown(page: str, label: str) -> str:
    """What an admin page shows right after a field's label."""
    at = page.index(label)
    return page[at : at + 400]


def test_a_cleanup_is_enqueued_once_after_its_job_ended_however_it_ended() -> None:
    job_id = say("x", chat="solo")
    claimed = claim_job(job_id)
    spec = cleanups.handler_spec("test.cleanup", {"n": 1})
    assert ledger_turns.add_cleanup(claimed.lease, name="c", spec=spec)
    assert not ledger_turns.add_cleanup(claimed.lease, name="c", spec=spec)  # the same one
    assert ledger_turns.fire_cleanups() == 0  # it runs: nothing yet
    operator = staff("cleanups-operator", "view_eventjob")
    page = operator.get(reverse("admin:feishu_inbox_eventjob_change", args=[job_id]))
    assert ">c</div>" in shown(page.text, "Cleanups waiting")
    expire_lease(job_id)
    ledger.expire_leases()  # no effect started: retried, not ended
    assert ledger_turns.fire_cleanups() == 0
    again = claim_job(job_id)
    ledger.fail(again.lease, error_type="Boom", message="x", final=True)
    assert ledger_turns.fire_cleanups() == 1
    assert ledger_turns.fire_cleanups() == 0
    [cleanup] = EventJob.objects.filter(event_type="test.cleanup")
    assert cleanup.payload == {"n": 1} and not TurnCleanup.objects.exists()
    page = operator.get(reverse("admin:feishu_inbox_eventjob_change", args=[job_id]))
    assert ">-</div>" in shown(page.text, "Cleanups waiting")


def test_an_unknown_job_has_ended_for_its_cleanups() -> None:
    job_id = say("x", chat="solo2")
    claimed = claim_job(job_id)
    ledger_turns.add_cleanup(claimed.lease, name="c", spec=cleanups.handler_spec("test.c", {}))
    ledger.begin_effect(claimed.lease)
    expire_lease(job_id)
    ledger.expire_leases()
    assert EventJob.objects.get(pk=job_id).status == Status.UNKNOWN
    assert ledger_turns.fire_cleanups() == 1


def test_on_finish_takes_a_handlers_type_or_a_task_and_a_refused_name() -> None:
    job_id = say("x", chat="solo3")
    with InHandler(claim_job(job_id)):
        assert feishu_inbox.on_finish("test.after", {"a": 1})
        assert not feishu_inbox.on_finish("test.after", {"a": 1})
        assert feishu_inbox.on_finish("test.after", {"a": 2}, name="second")
        with pytest.raises(LedgerError, match="1 to 64"):
            cleanups.on_finish(cleanups.handler_spec("x", {}), name="")
    assert sorted(TurnCleanup.objects.values_list("name", flat=True)) == ["second", "test.after"]


@pytest.mark.usefixtures("registry")
def test_bad_turn_settings_are_refused_with_what_was_wrong() -> None:
    @registry.handler(
        "test.bad_turn",
        coalesce=turns.Coalesce(quiet=-1, max_messages=0, during="later", on_recall="x"),
        stale_after=timedelta(0),
        on_stale="ignore",
    )
    def bad(event: Any) -> None: ...

    with pytest.raises(ConfigurationError) as refused:
        registry.validate()
    text = str(refused.value)
    for words in ("quiet", "max_messages", "during", "on_recall", "stale_after", "on_stale"):
        assert words in text, words
    assert registry.turns_for("test.bad_turn") == (None, None)


def test_feishu_messages_read_texts_rich_texts_other_types_and_recalls() -> None:
    envelope = message_event(text="hello there")
    message = READER.message(1, "e1", "im.message.receive_v1", envelope)
    assert message is not None and message.text == "hello there"
    assert message.sender == "ou_user1" and message.sent_at is not None
    post = {"title": "T", "content": [[{"tag": "text", "text": "one"}, {"tag": "at"}]]}
    envelope["event"]["message"].update(message_type="post", content=json.dumps(post))
    assert READER.message(1, "e1", "im.message.receive_v1", envelope).text == "T one"
    envelope["event"]["message"].update(message_type="image", content="{}")
    assert READER.message(1, "e1", "im.message.receive_v1", envelope).text == "[image]"
    assert READER.message(1, "e1", "card.action.trigger", envelope) is None
    recalled = {"event": {"message_id": "om_1", "chat_id": "oc"}}
    assert READER.recalled("im.message.recalled_v1", recalled) == "om_1"
    assert READER.recalled("im.message.receive_v1", recalled) is None


def test_a_stop_buttons_value_is_signed() -> None:
    from feishu_inbox.feishu import protocol

    click = card_action()
    click["event"]["action"]["value"] = stop_value(42)
    assert stop_click(protocol.parse_envelope(click)) == 42
    click["event"]["action"]["value"] = {"feishu_inbox.stop": "43:forged"}
    assert stop_click(protocol.parse_envelope(click)) is None


@pytest.fixture
def fake() -> Iterator[FakeFeishu]:
    with FakeFeishu(apps={"cli_sdk": "sdk-secret"}) as fake:
        yield fake


def test_the_fakes_reactions_answer_as_the_official_sdk_reads_them(fake: FakeFeishu) -> None:
    client = (
        lark_oapi.Client.builder()
        .app_id("cli_sdk")
        .app_secret("sdk-secret")
        .domain(fake.url)
        .build()
    )
    body = CreateMessageReactionRequestBody({"reaction_type": {"emoji_type": "Typing"}})
    made = client.im.v1.message_reaction.create(
        CreateMessageReactionRequest.builder().message_id("om_1").request_body(body).build()
    )
    assert made.success(), made.msg
    assert made.data.reaction_type.emoji_type == "Typing"
    assert made.data.operator.operator_type == "app"
    listed = client.im.v1.message_reaction.list(
        ListMessageReactionRequest.builder().message_id("om_1").reaction_type("Typing").build()
    )
    assert listed.success() and [r.reaction_id for r in listed.data.items] == [
        made.data.reaction_id
    ]
    removed = client.im.v1.message_reaction.delete(
        DeleteMessageReactionRequest.builder()
        .message_id("om_1")
        .reaction_id(made.data.reaction_id)
        .build()
    )
    assert removed.success() and fake.reactions.left() == []
    again = client.im.v1.message_reaction.delete(
        DeleteMessageReactionRequest.builder()
        .message_id("om_1")
        .reaction_id(made.data.reaction_id)
        .build()
    )
    assert not again.success() and again.code == 231008
    fake.reactions.recall("om_2")
    refused = client.im.v1.message_reaction.create(
        CreateMessageReactionRequest.builder().message_id("om_2").request_body(body).build()
    )
    assert refused.code == 230011


def test_a_decided_end_is_the_end_of_every_later_attempt() -> None:
    head = say("do this", chat="default:chat:oc_again")
    say("/stop", chat="default:chat:oc_again")
    claimed = claim_job(head)
    with InHandler(claimed) as ctx, pytest.raises(Concluded):
        turns.begin(ctx, NOW, None)
    ledger.hand_back(claimed.lease)  # it died before its finish was written (so to speak)
    outcome, why = begin(head, NOW)
    assert outcome == "Concluded" and why.note == "Stopped"  # not run with "/stop" in it


def test_two_merges_in_one_attempt_are_two_records_and_a_retry_sees_both() -> None:
    chat = "default:chat:oc_merges"
    head = say("first", chat=chat)
    spec = turns.Coalesce(quiet=0, max_wait=0, during="merge")
    claimed = claim_job(head)
    with InHandler(claimed) as ctx:
        turns.begin(ctx, spec, None)
        for text in ("second", "third"):
            say(text, chat=chat)
            turns.merge(ctx)
        assert [m.text for m in ctx.event.turn.messages] == ["first", "second", "third"]
    ledger.hand_back(claimed.lease)
    _, turn = begin(head, spec)
    assert [m.text for m in turn.messages] == ["first", "second", "third"] and turn.merged == 2


def test_only_the_late_messages_of_a_burst_are_stale() -> None:
    chat = "default:chat:oc_outage"
    old = message_event(chat_id="oc_outage", text="this morning")
    old["event"]["message"]["create_time"] = "0"
    head = ledger.enqueue(
        event_id="old", event_type="im.message.receive_v1", partition_key=chat, payload=old
    ).job_id
    fresh = say("hello?", chat=chat)
    deadline = turns.StartDeadline.of(timedelta(minutes=30), "skip", "sorry")
    outcome, why = begin(head, NOW, deadline)
    assert outcome == "Concluded" and why.note == "Stale"
    assert EventJob.objects.get(pk=fresh).status == Status.QUEUED  # its own turn, next
    outcome, turn = begin(fresh, NOW, deadline)
    assert outcome == "turn" and turn.text == "hello?"


def test_a_turn_in_a_private_chat_stops_being_a_private_message() -> None:
    envelope = message_event(chat_id="oc_p2p", text="hi", chat_type="p2p")
    head = ledger.enqueue(
        event_id="p1",
        event_type="im.message.receive_v1",
        partition_key="default:chat:oc_p2p",
        payload=envelope,
        private_message=True,
    ).job_id
    outcome, _ = begin(head, NOW)
    assert outcome == "turn" and not EventJob.objects.get(pk=head).private_message


def test_a_recall_in_a_topic_thread_goes_behind_its_messages_turn() -> None:
    from feishu_inbox.feishu import inbound, protocol

    message = message_event(chat_id="oc_topic", thread_id="omt_1", text="in a thread")
    stored = inbound.store("default", protocol.parse_envelope(message))
    recall_event = message_event(chat_id="oc_topic")
    recall_event["header"]["event_type"] = "im.message.recalled_v1"
    recall_event["event"] = {
        "message_id": message["event"]["message"]["message_id"],
        "chat_id": "oc_topic",
    }
    recalled = inbound.store("default", protocol.parse_envelope(recall_event))
    jobs = EventJob.objects.in_bulk([stored.job_id, recalled.job_id])
    assert jobs[recalled.job_id].partition_key == jobs[stored.job_id].partition_key
    assert jobs[stored.job_id].partition_key.endswith(":thread:omt_1")
