"""Conversation turns (SPEC §9g) on real workers, the endings test_turn_workers.py leaves: a
recall that cancels the running turn (``on_recall="cancel"``, or every message recalled), and
a typing reaction whose add lands after the turn ended (Feishu applying a request whose answer
timed out), which still comes off. The rule for a thread abandoned at its timeout is held in
test_turns.py. The bot is tests/support/turn_handlers.py; the fixtures are
test_turn_workers.py's."""

from __future__ import annotations

from typing import Any

import pytest

from feishu_inbox.feishu.turns import REMOVE_REACTION
from feishu_inbox.models import EventJob, Status
from tests.feishu.test_turn_workers import (  # noqa: F401 (fake and webhook are fixtures)
    Chat,
    fake,
    jobs,
    replies_to,
    settled,
    turn_env,
    webhook,
)
from tests.support.fake_feishu import FakeFeishu, Fault
from tests.support.processes import wait_for
from tests.support.worker_helpers import Workers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("policy", ["cancel", "flag"])
def test_a_recall_cancels_the_running_turn_by_policy_or_when_nothing_is_left(
    policy: str,
    webhook: Any,  # noqa: F811
    fake: FakeFeishu,  # noqa: F811
    workers: Workers,
) -> None:
    """``on_recall="cancel"``: one recalled message cancels the running turn; ``"flag"``: a
    turn whose every message is recalled is cancelled all the same. Either way it ends
    ``Cancelled`` at its next safe point: no reply, and its reaction comes off."""
    chat = Chat(webhook, fake, f"oc_recall_{policy}")
    first = chat.say("holdfast")  # held at its checkpoints until one of them ends it
    second = chat.say("and this")
    workers.start(**turn_env(fake, TURN_ON_RECALL=policy))
    wait_for(lambda: workers.lines("gated"), 60, "the turn to run")
    chat.recall(second)
    recalls = 1
    if policy == "flag":
        chat.recall(first)
        recalls = 2
    wait_for(lambda: settled(chat, len(chat.sent) + recalls), 60, "the turn to end")
    turn = jobs(chat)[0]
    assert (turn.status, turn.error_type) == (Status.COMPLETED, "Cancelled")
    assert not workers.lines("stream")  # it never reached its reply
    assert replies_to(fake, chat.sent) == []
    # the reaction is on the turn's newest live message (the second, until it was recalled;
    # a recalled message's reactions go with it)
    assert len(fake.reactions.added) == 1 and fake.reactions.left() == []


def test_a_reaction_whose_add_timed_out_and_landed_late_comes_off(
    webhook: Any,  # noqa: F811
    fake: FakeFeishu,  # noqa: F811
    workers: Workers,
) -> None:
    """The add's answer times out (2 s) and Feishu applies it 10 s late, after the turn ended
    and its removal ran: the add recorded a second removal for when no such add can land,
    which takes it off."""
    chat = Chat(webhook, fake, "oc_late_add")
    fake.fail_next(Fault("slow_before_apply", delay=10.0), endpoint="reaction")
    workers.start(**turn_env(fake, TURN_OPENAPI_TIMEOUT="2"))
    message = chat.say("hello")
    wait_for(lambda: workers.lines("streamed"), 60, "the turn's reply")
    wait_for(lambda: fake.reactions.added, 60, "the late add to land")
    wait_for(lambda: settled(chat, 1) and not fake.reactions.left(), 90, "the reaction to go")
    landed = fake.reactions.added[0]
    assert landed.message_id == message
    assert [r.reaction_id for r in fake.reactions.removed] == [landed.reaction_id]
    removals = EventJob.objects.filter(event_type=REMOVE_REACTION).order_by("id")
    assert [(j.status, j.payload.get("not_before") is not None) for j in removals] == [
        (Status.COMPLETED, False),
        (Status.COMPLETED, True),
    ]
