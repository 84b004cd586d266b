"""Asking in a card (SPEC §9e, ``feishu_inbox.ask``) in the ledger, against the fake Open API:
the card, the click decided once before its answer, a second, late or unauthorised click that
changes nothing, the card's update, a slow database; on both databases.
tests/feishu/test_ask_workers.py proves the same through real workers and the long connection.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import pytest
from django.db import connection, connections

import feishu_inbox
from feishu_inbox import ledger
from feishu_inbox.errors import (
    FeishuTransientError,
    InvalidMessage,
    QuestionExpired,
    Suspended,
    WaitTimedOut,
)
from feishu_inbox.feishu import asks, inbound, protocol, questions
from feishu_inbox.ledger import waits
from feishu_inbox.models import EventJob, Status
from feishu_inbox.runtime import attempts
from feishu_inbox.waiting import Wait
from tests.runtime.test_steps import InHandler
from tests.support.factories import EventJobFactory
from tests.support.fake_feishu import DROP_AFTER_APPLY, FakeFeishu
from tests.support.fake_feishu_ws import card_action
from tests.support.ledger_helpers import make_due
from tests.support.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CHOICES = ["Approve", "Reject"]


def question_job(fake: FakeFeishu, n: int = 1, chat: str = "oc_1") -> EventJob:
    fake.add_inbound(f"om_in_{n}", chat)
    return EventJobFactory(
        app="bot",
        event_id=f"ev_ask_{n}",
        partition_key=chat,
        payload={"event": {"message": {"message_id": f"om_in_{n}", "chat_id": chat}}},
    )


def run(ask: Any) -> tuple[str, Any]:
    """Claim the due job and run ``ask()`` as its handler: ("returned", value),
    ("raised", exception) or ("suspended", the job's state)."""
    [claimed] = ledger.claim("w")
    with InHandler(claimed) as ctx:
        try:
            return "returned", ask(ctx.event)
        except Suspended as suspended:
            return "suspended", attempts.suspend(ctx, suspended)
        except Exception as exc:
            return "raised", exc


def asking(**kwargs: Any) -> Any:
    def ask(event: feishu_inbox.Event) -> Any:
        return feishu_inbox.ask(
            event, "Delete these 40 records?", choices=CHOICES, **{"timeout": 3600, **kwargs}
        )

    return ask


def buttons(fake: FakeFeishu) -> dict[str, dict[str, str]]:
    """The callback value of each button of the one question card, by its label."""
    [card] = fake.cardkit.cards.values()
    [row] = [e for e in card.data["body"]["elements"] if e["tag"] == "column_set"]
    found = {}
    for column in row["columns"]:
        [button] = column["elements"]
        found[button["text"]["content"]] = button["behaviors"][0]["value"]
    return found


def shown(fake: FakeFeishu) -> str:
    """What the question card shows where its buttons were."""
    [card] = fake.cardkit.cards.values()
    return card.elements[asks.CHOICES_ELEMENT]


def click(value: dict[str, Any], open_id: str = "ou_alice", budget: float = 2.5) -> Any:
    """A ``card.action.trigger`` with ``value`` by ``open_id``, answered as the webhook and
    the long connection answer it."""
    body = card_action()
    body["event"]["action"]["value"] = value
    body["event"]["operator"]["open_id"] = open_id
    return inbound.answer_card("bot", protocol.parse_envelope(body), budget)


def toast(answer: dict[str, Any]) -> str:
    return str(answer["toast"]["content"])


def test_a_click_is_decided_once_and_the_card_shows_the_decision(
    fake_feishu: FakeFeishu,
) -> None:
    job = question_job(fake_feishu)
    assert run(asking()) == ("suspended", "waiting")
    # one reply, carrying the card entity, whose buttons name the question
    [message] = fake_feishu.messages
    assert message.parent_id == "om_in_1" and message.card_id
    values = buttons(fake_feishu)
    assert list(values) == CHOICES
    key = values["Approve"][questions.MARKER]
    assert key == "ask:bot:ev_ask_1:ask"
    assert Wait.objects.get(job=job).ask == {"choices": CHOICES, "who": None}

    assert click(values["Reject"]) == {"toast": {"type": "success", "content": "Received: Reject"}}
    assert EventJob.objects.get(pk=job.pk).status == Status.QUEUED  # resumes, once
    assert toast(click(values["Approve"], "ou_bob")) == "Already decided."
    assert Wait.objects.get(job=job).payload["choice"] == "Reject"

    how, answer = run(asking())
    assert how == "returned"
    assert (answer.choice, answer.open_id) == ("Reject", "ou_alice")
    assert answer.card_id == message.card_id and answer.message_id == message.message_id
    assert "**Reject** — chosen by <at id=ou_alice></at>" in shown(fake_feishu)
    assert len(fake_feishu.messages) == 1  # the resumed run sent nothing again

    updates = [r for r in fake_feishu.cardkit.requests if r.operation == "update"]
    assert [(r.sequence, r.outcome) for r in updates] == [(1, "applied")]


@pytest.mark.parametrize("forgotten", [False, True], ids=["uuid-known", "uuid-forgotten"])
def test_the_card_update_sent_again_after_a_lost_answer_is_the_same_operation(
    fake_feishu: FakeFeishu, forgotten: bool
) -> None:
    job = question_job(fake_feishu)
    run(asking())
    click(buttons(fake_feishu)["Approve"])
    # the update applied, then its answer lost (the connection dropped): the job is retried
    fake_feishu.fail_next(DROP_AFTER_APPLY, endpoint="card")
    [claimed] = ledger.claim("w")
    with InHandler(claimed) as ctx, pytest.raises(FeishuTransientError):
        asking()(ctx.event)
    assert ledger.fail(claimed.lease, error_type="FeishuTransientError", retry_in=0) == (
        "retry_wait"
    )
    make_due(job.pk)
    if forgotten:  # Feishu no longer knows the uuid: the card's sequence says it was applied
        next(iter(fake_feishu.cardkit.cards.values())).uuids.clear()
    how, answer = run(asking())
    assert (how, answer.choice) == ("returned", "Approve")
    outcomes = [r.outcome for r in fake_feishu.cardkit.requests if r.operation == "update"]
    again = "sequence_refused" if forgotten else "duplicate"
    assert outcomes == ["applied", again]  # (the first one's answer was dropped)
    assert "**Approve**" in shown(fake_feishu)
    assert len(fake_feishu.messages) == 1


def test_a_click_by_someone_not_in_who_is_not_yours_and_changes_nothing(
    fake_feishu: FakeFeishu,
) -> None:
    job = question_job(fake_feishu)
    assert run(asking(who=["ou_alice"])) == ("suspended", "waiting")
    values = buttons(fake_feishu)
    before = list(Wait.objects.values())
    assert click(values["Approve"], "ou_mallory") == {
        "toast": {"type": "warning", "content": "This question is not yours to answer."}
    }
    assert list(Wait.objects.values()) == before
    assert EventJob.objects.get(pk=job.pk).status == Status.WAITING
    # a value its buttons never carried
    forged = {**values["Approve"], "choice": "Delete everything"}
    assert toast(click(forged)) == "That is not one of this question's choices."
    assert list(Wait.objects.values()) == before
    assert toast(click(values["Approve"], "ou_alice")) == "Received: Approve"
    assert run(asking(who=["ou_alice"]))[1].open_id == "ou_alice"


def test_at_the_timeout_the_card_says_expired_and_a_late_click_changes_nothing(
    fake_feishu: FakeFeishu,
) -> None:
    job = question_job(fake_feishu)
    assert run(asking(timeout=0.2)) == ("suspended", "waiting")
    values = buttons(fake_feishu)
    wait_for(lambda: waits.time_out_due() == 1, 10, "the question's timeout")
    how, raised = run(asking(timeout=0.2))
    assert how == "raised" and isinstance(raised, QuestionExpired)
    assert isinstance(raised, WaitTimedOut) and raised.code == "question_expired"
    assert shown(fake_feishu) == asks.EXPIRED_TEXT
    before = list(Wait.objects.values()), EventJob.objects.get(pk=job.pk).status
    assert click(values["Approve"]) == {
        "toast": {"type": "warning", "content": "This question has expired."}
    }
    assert (list(Wait.objects.values()), EventJob.objects.get(pk=job.pk).status) == before
    # a question nobody asked (no such wait), and a malformed value of ours
    assert toast(click({questions.MARKER: "ask:bot:nope:ask", "choice": "x"})) == (
        "This question has expired."
    )
    assert toast(click({questions.MARKER: 7})) == "This question has expired."


def test_two_clicks_at_once_make_one_decision(fake_feishu: FakeFeishu) -> None:
    job = question_job(fake_feishu)
    run(asking())
    values = buttons(fake_feishu)
    answers: list[str] = []
    start = threading.Barrier(2)

    def clicker(label: str, open_id: str) -> None:
        start.wait()
        try:
            answers.append(toast(click(values[label], open_id)))
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=clicker, args=("Approve", "ou_a")),
        threading.Thread(target=clicker, args=("Reject", "ou_b")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.split(":")[0] for a in answers) == ["Already decided.", "Received"]
    [wait] = Wait.objects.filter(job=job)
    assert wait.state == "delivered"
    assert f"Received: {wait.payload['choice']}" in answers


def test_the_sites_card_callback_gets_every_click_that_is_not_a_question(
    fake_feishu: FakeFeishu,
) -> None:
    seen: list[Any] = []

    @feishu_inbox.card_callback("bot")
    def on_card(action: feishu_inbox.CardAction) -> dict[str, Any]:
        seen.append(action.action["value"])
        return {"toast": {"type": "info", "content": "site"}}

    try:
        assert toast(click({"choice": "yes"})) == "site"
        assert toast(click({questions.MARKER: "ask:bot:nope:ask", "choice": "x"})) == (
            "This question has expired."
        )
    finally:
        protocol._card_callbacks.pop("bot", None)
    assert seen == [{"choice": "yes"}]


def test_bad_arguments_are_refused_before_anything_is_sent(fake_feishu: FakeFeishu) -> None:
    question_job(fake_feishu)
    [claimed] = ledger.claim("w")
    bad: list[dict[str, Any]] = [
        {"choices": []},
        {"choices": "Approve"},
        {"choices": ["a", "a"]},
        {"choices": ["x" * 65]},
        {"who": "ou_alice"},
        {"who": []},
        {"name": ""},
        {"card": {"elements": []}},
    ]
    with InHandler(claimed) as ctx:
        for kwargs in bad:
            arguments = {"card": "Sure?", "choices": CHOICES, "timeout": 60, **kwargs}
            card = arguments.pop("card")
            with pytest.raises(InvalidMessage) as refused:
                feishu_inbox.ask(ctx.event, card, **arguments)
            assert refused.value.code == "invalid_argument", kwargs
    assert fake_feishu.messages == [] and fake_feishu.cardkit.cards == {}
    assert not Wait.objects.exists()


@contextmanager
def key_locked(key: str) -> Iterator[None]:
    """The database slow for this question's key: another connection holds the key's lock
    (PostgreSQL: its advisory lock; SQLite: the file's write lock)."""
    if connection.vendor == "postgresql":
        import psycopg

        settings = connection.settings_dict
        with psycopg.connect(
            dbname=settings["NAME"],
            user=settings["USER"],
            host=settings["HOST"],
            port=settings["PORT"] or 5432,
            password=settings["PASSWORD"] or None,
            autocommit=False,
        ) as other:
            other.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 7483))", (key,))
            try:
                yield
            finally:
                other.rollback()
        return
    with closing(sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)) as db:
        db.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            db.execute("ROLLBACK")


def test_a_slow_database_is_answered_in_time_and_the_click_still_counts_once(
    fake_feishu: FakeFeishu,
) -> None:
    job = question_job(fake_feishu)
    run(asking())
    values = buttons(fake_feishu)
    key = values["Approve"][questions.MARKER]
    connection.close()  # (SQLite: the test's own connection holds no lock)
    with key_locked(key):
        started = time.monotonic()
        answer = click(values["Approve"], budget=0.5)
        took = time.monotonic() - started
        assert toast(answer).startswith("Received, not confirmed yet")
        assert took < 1.5, took  # the budget (0.5 s), not the database's pace
    # the click's transaction goes on once the database answers: decided, once
    wait_for(
        lambda: EventJob.objects.get(pk=job.pk).status == Status.QUEUED, 30, "the late decision"
    )
    assert toast(click(values["Reject"])) == "Already decided."
    how, answer = run(asking())
    assert (how, answer.choice) == ("returned", "Approve")
    payloads = [w.payload for w in Wait.objects.filter(job=job)]
    assert [p["choice"] for p in payloads] == ["Approve"]
    assert json.dumps(payloads)  # JSON data, as stored


def test_the_webhook_decides_a_click_before_it_answers(
    fake_feishu: FakeFeishu, client: Any
) -> None:
    job = question_job(fake_feishu)
    run(asking())
    body = card_action()
    body["event"]["action"]["value"] = buttons(fake_feishu)["Approve"]

    def post() -> Any:
        return client.post("/feishu/bot/events/", json.dumps(body), content_type="application/json")

    started = time.monotonic()
    response = post()
    assert time.monotonic() - started < 3.0
    assert (response.status_code, response.json()) == (
        200,
        {"toast": {"type": "success", "content": "Received: Approve"}},
    )
    assert EventJob.objects.get(pk=job.pk).status == Status.QUEUED  # before the answer
    assert not EventJob.objects.filter(event_type="card.action.trigger").exists()
    body["header"]["event_id"] = "another"
    assert toast(post().json()) == "Already decided."


def test_an_async_handler_awaits_its_answer(fake_feishu: FakeFeishu) -> None:
    question_job(fake_feishu)

    def ask_async(event: feishu_inbox.Event) -> Any:
        async def handler() -> Any:
            return await feishu_inbox.ask(event, "Sure?", choices=CHOICES, timeout=60)

        return asyncio.run(handler())

    assert run(ask_async) == ("suspended", "waiting")
    assert toast(click(buttons(fake_feishu)["Approve"])) == "Received: Approve"
    how, answer = run(ask_async)
    assert (how, answer.choice, answer.open_id) == ("returned", "Approve", "ou_alice")
    assert "**Approve**" in shown(fake_feishu)


def test_a_lost_answer_to_the_cards_send_is_sent_again_and_the_job_still_waits(
    fake_feishu: FakeFeishu,
) -> None:
    job = question_job(fake_feishu)
    fake_feishu.fail_next(DROP_AFTER_APPLY)  # the reply created, then the connection drops
    [claimed] = ledger.claim("w")
    with InHandler(claimed) as ctx, pytest.raises(FeishuTransientError):
        asking()(ctx.event)
    assert ledger.fail(claimed.lease, error_type="FeishuTransientError", retry_in=0) == (
        "retry_wait"
    )
    make_due(job.pk)
    # the retry sends the same reply (its uuid: Feishu's duplicate), then waits
    assert run(asking()) == ("suspended", "waiting")
    assert [r.outcome for r in fake_feishu.requests if "reply" in r.path] == [
        "drop_after_apply",
        "duplicate",
    ]
    assert len(fake_feishu.messages) == 1 and len(fake_feishu.cardkit.cards) == 1
    assert toast(click(buttons(fake_feishu)["Reject"])) == "Received: Reject"
    how, answer = run(asking())
    assert (how, answer.choice) == ("returned", "Reject")


@pytest.mark.usefixtures("postgres_only")
def test_a_click_finds_its_question_by_the_partial_index_of_questions() -> None:
    """question_of_key reads any state of a question's wait (a late click): by the index of
    questions' keys, never by a scan of every wait."""
    from feishu_inbox.store import store

    job = EventJobFactory()
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {Wait._meta.db_table} (job_id, name, key, state, hold_chat, "
            "created_at, partition_key, ask) SELECT %s, 'w' || g, 'k' || g, 'delivered', FALSE, "
            "now(), '', CASE WHEN g %% 100 = 0 THEN '{}'::jsonb END "
            "FROM generate_series(1, 20000) g",
            [job.pk],
        )
        cur.execute("ANALYZE")
        cur.execute("EXPLAIN " + store().queries["question_of_key"].sql, {"key": "k100"})
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "feishu_inbox_wait_question" in plan and "Seq Scan" not in plan, plan
