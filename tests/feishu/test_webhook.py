"""The webhook: verification, decryption, deduplication, durability, and every refusal."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import IntegrityError, OperationalError, connection, connections
from django.test import Client, override_settings

from feishu_inbox import EventKeys, card_callback, event_keys, telemetry
from feishu_inbox.feishu import inbound
from feishu_inbox.feishu import protocol as feishu
from feishu_inbox.feishu.webhook import database_failure
from feishu_inbox.models import EventJob, Partition
from tests.support.feishu_client import (
    ENCRYPT_KEY,
    TOKEN,
    delivery,
    django_headers,
    encrypt,
    message_event,
    sign,
    signed_headers,
)

APPS = {
    "default": {"ENCRYPT_KEY": ENCRYPT_KEY, "VERIFICATION_TOKEN": TOKEN},
    "plain": {"VERIFICATION_TOKEN": TOKEN},
}
URL = "/feishu/events/"


@pytest.fixture(autouse=True)
def feishu_apps() -> Iterator[None]:
    with override_settings(FEISHU_INBOX={"APPS": APPS}):
        yield


@pytest.fixture(autouse=True)
def clean_registries() -> Iterator[None]:
    keys, cards = dict(feishu._key_functions), dict(feishu._card_callbacks)
    yield
    feishu._key_functions.clear()
    feishu._key_functions.update(keys)
    feishu._card_callbacks.clear()
    feishu._card_callbacks.update(cards)


def post(body: bytes, headers: dict[str, str], url: str = URL) -> Any:
    return Client().post(url, body, content_type="application/json", **django_headers(headers))


def send(envelope: dict[str, Any], url: str = URL, **kwargs: Any) -> Any:
    return post(*delivery(envelope, **kwargs), url=url)


def nothing_stored() -> bool:
    return not EventJob.objects.exists() and not Partition.objects.exists()


# --- protocol known answers --------------------------------------------------------------


def test_official_decrypt_example() -> None:
    plain = feishu.decrypt("test key", "P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=")
    assert plain == b"hello world"


def test_signature_is_sha256_over_timestamp_nonce_key_and_raw_body() -> None:
    body = b'{"encrypt":"abc"}'
    assert feishu.signature("1700000000", "n1", "k", body) == sign("1700000000", "n1", "k", body)
    assert feishu.signature_matches(
        "1700000000", "n1", "k", body, sign("1700000000", "n1", "k", body)
    )
    assert not feishu.signature_matches(
        "1700000000", "n1", "k", body + b" ", sign("1700000000", "n1", "k", body)
    )


# --- accepted deliveries ------------------------------------------------------------------


@pytest.mark.django_db
def test_encrypted_signed_message_is_stored_once_with_its_keys() -> None:
    envelope = message_event(chat_id="oc_42", message_id="om_1", chat_type="p2p")
    response = send(envelope)
    assert response.status_code == 200, response.content
    assert response.json() == {"ok": True, "duplicate": False}
    job = EventJob.objects.get()
    assert job.payload == envelope
    assert (job.app, job.event_id, job.event_type) == (
        "default",
        envelope["header"]["event_id"],
        "im.message.receive_v1",
    )
    assert job.dedupe_key == "message:om_1"
    assert job.partition_key == "default:chat:oc_42"
    assert job.private_message is True
    assert job.status == "queued"


@pytest.mark.django_db
def test_plaintext_app_checks_only_the_token() -> None:
    response = send(message_event(), url="/feishu/plain/events/", key=None)
    assert response.status_code == 200
    assert EventJob.objects.get().app == "plain"


@pytest.mark.django_db
def test_schema_1_envelope_is_accepted() -> None:
    envelope = {
        "uuid": "u-123",
        "ts": "1700000000.1",
        "token": TOKEN,
        "type": "event_callback",
        "event": {"type": "add_bot", "chat_id": "oc_7", "open_id": "ou_1"},
    }
    assert send(envelope).status_code == 200
    job = EventJob.objects.get()
    assert (job.event_id, job.event_type, job.dedupe_key, job.partition_key) == (
        "u-123",
        "add_bot",
        "event:u-123",
        "default:chat:oc_7",
    )


@pytest.mark.django_db
def test_same_message_under_two_event_ids_is_one_job() -> None:
    first = send(message_event(message_id="om_same"))
    second = send(message_event(message_id="om_same"))
    assert (first.status_code, second.status_code) == (200, 200)
    assert second.json() == {"ok": True, "duplicate": True}
    assert EventJob.objects.count() == 1


@pytest.mark.django_db
def test_redelivery_of_the_same_event_is_one_job() -> None:
    envelope = message_event()
    for _ in range(3):
        assert send(envelope).status_code == 200
    assert EventJob.objects.count() == 1


@pytest.mark.django_db
def test_topic_thread_partitions_by_chat_and_thread() -> None:
    send(message_event(chat_id="oc_1", thread_id="omt_9"))
    assert EventJob.objects.get().partition_key == "default:chat:oc_1:thread:omt_9"


@pytest.mark.django_db
def test_other_events_partition_by_user_or_by_themselves() -> None:
    def v2(event_type: str, event: dict[str, Any]) -> dict[str, Any]:
        return {
            "schema": "2.0",
            "header": {"event_id": f"e-{event_type}", "event_type": event_type, "token": TOKEN},
            "event": event,
        }

    send(v2("contact.user.updated_v3", {"object": {}, "user_id": {"open_id": "ou_5"}}))
    send(v2("application.installed", {}))
    keys = dict(EventJob.objects.values_list("event_type", "partition_key"))
    assert keys == {
        "contact.user.updated_v3": "default:user:ou_5",
        "application.installed": "default:event:e-application.installed",
    }


@pytest.mark.django_db
def test_site_overrides_keys_per_event_type() -> None:
    @event_keys("im.message.receive_v1")
    def by_sender(envelope: feishu.Envelope) -> EventKeys:
        sender = envelope.event["sender"]["sender_id"]["open_id"]
        return EventKeys(dedupe_key=f"x:{envelope.event_id}", partition_key=f"sender:{sender}")

    send(message_event(chat_type="p2p"))
    job = EventJob.objects.get()
    assert job.partition_key == "default:sender:ou_user1"
    assert job.dedupe_key.startswith("x:") and job.private_message is False


@pytest.mark.django_db
@pytest.mark.parametrize("app", ["default", "plain"])
def test_url_verification_answers_the_challenge_and_stores_nothing(app: str) -> None:
    challenge = {"challenge": "ch-123", "token": TOKEN, "type": "url_verification"}
    key = ENCRYPT_KEY if app == "default" else None
    url = URL if app == "default" else f"/feishu/{app}/events/"
    response = send(challenge, url=url, key=key, signed=False)
    assert response.status_code == 200
    assert response.json() == {"challenge": "ch-123"}
    assert nothing_stored()


# --- refusals: each a clear status, a short JSON error, and nothing stored --------------------


def _bad(case: str) -> tuple[bytes, dict[str, str], str]:
    """(body, headers, url) for one row of the bad-input table."""
    good = message_event()
    if case == "not_json":
        return b"{not json", {}, "/feishu/plain/events/"
    if case == "not_object":
        return b'["a"]', {}, "/feishu/plain/events/"
    if case == "missing_id":
        env = message_event()
        del env["header"]["event_id"]
        return *delivery(env), URL
    if case == "missing_type":
        env = message_event()
        env["header"]["event_type"] = ""
        return *delivery(env), URL
    if case == "unknown_schema":
        return *delivery({**good, "schema": "3.0"}), URL
    if case == "no_envelope":
        return *delivery({"hello": "world"}), URL
    if case == "bad_signature":
        body, headers = delivery(good)
        headers["X-Lark-Signature"] = "0" * 64
        return body, headers, URL
    if case == "body_tampered":
        body, headers = delivery(good)
        return body.replace(b'{"encrypt"', b'{ "encrypt"'), headers, URL
    if case == "missing_signature":
        return *delivery(good, signed=False), URL
    if case == "stale_timestamp":
        return *delivery(good, timestamp=str(int(time.time()) - 3600)), URL
    if case == "future_timestamp":
        return *delivery(good, timestamp=str(int(time.time()) + 3600)), URL
    if case == "wrong_token":
        return *delivery(message_event(token="nope")), URL
    if case == "wrong_token_plain":
        return *delivery(message_event(token="nope"), key=None), "/feishu/plain/events/"
    if case == "undecryptable":
        body = json.dumps({"encrypt": encrypt("another key", json.dumps(good).encode())}).encode()
        return body, signed_headers(body), URL
    if case == "not_base64":
        body = b'{"encrypt": "***"}'
        return body, signed_headers(body), URL
    if case == "plaintext_to_encrypted_app":
        return *delivery(good, key=None), URL
    if case == "unknown_app":
        return *delivery(good), "/feishu/nobody/events/"
    raise AssertionError(case)


BAD_INPUT = {
    "not_json": (400, "invalid_json"),
    "not_object": (400, "invalid_json"),
    "missing_id": (400, "missing_fields"),
    "missing_type": (400, "missing_fields"),
    "unknown_schema": (400, "unknown_schema"),
    "no_envelope": (400, "unknown_schema"),
    "bad_signature": (401, "bad_signature"),
    "body_tampered": (401, "bad_signature"),
    "missing_signature": (401, "missing_signature"),
    "stale_timestamp": (401, "stale_timestamp"),
    "future_timestamp": (401, "stale_timestamp"),
    "wrong_token": (401, "bad_token"),
    "wrong_token_plain": (401, "bad_token"),
    "undecryptable": (400, "undecryptable"),
    "not_base64": (400, "undecryptable"),
    "plaintext_to_encrypted_app": (400, "not_encrypted"),
    "unknown_app": (404, "unknown_app"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_refused_and_stores_nothing(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    body, headers, url = _bad(case)
    response = post(body, headers, url=url)
    status, code = BAD_INPUT[case]
    assert response.status_code == status
    assert response.json()["error"] == code
    assert response.json()["message"]
    assert nothing_stored()
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert code in logged or "unknown app" in logged
    assert ENCRYPT_KEY not in logged and TOKEN not in logged
    text = body.decode(errors="replace")
    assert all(chunk not in logged for chunk in (text[10:40], text[-30:-2]) if len(chunk) > 8)


@pytest.mark.django_db
def test_wrong_method_is_405() -> None:
    response = Client().get(URL)
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert response.json()["error"] == "method_not_allowed"


@pytest.mark.django_db
def test_body_over_the_limit_is_413() -> None:
    envelope = message_event(text="x" * 5000)
    with override_settings(FEISHU_INBOX={"APPS": APPS, "MAX_BODY_BYTES": 4096}):
        response = send(envelope)
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"
    assert nothing_stored()


@pytest.mark.django_db
def test_chunked_body_without_a_server_that_dechunks_it_is_411() -> None:
    # Django's test client, like runserver, does not set wsgi.input_terminated: the body
    # cannot be read safely, and reading it as empty would answer a misleading invalid_json.
    body, headers = delivery(message_event())
    response = Client().post(
        URL,
        body,
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
        **django_headers(headers),
    )
    assert response.status_code == 411
    assert response.json()["error"] == "length_required"
    assert "Content-Length" in response.json()["message"]
    assert nothing_stored()


@pytest.mark.django_db
def test_replay_window_can_be_turned_off() -> None:
    with override_settings(FEISHU_INBOX={"APPS": APPS, "REPLAY_WINDOW_SECONDS": None}):
        assert send(message_event(), timestamp="1000000000").status_code == 200


# --- card action callbacks --------------------------------------------------------------------


def card_event(value: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "schema": "2.0",
        "header": {"event_id": "card-1", "event_type": "card.action.trigger", "token": TOKEN},
        "event": {
            "operator": {"open_id": "ou_op"},
            "action": {"tag": "button", "value": value or {"do": "approve"}},
            "context": {"open_message_id": "om_card", "open_chat_id": "oc_card"},
        },
    }


@pytest.mark.django_db
def test_unregistered_card_callback_answers_empty_and_stores_nothing() -> None:
    response = send(card_event())
    assert (response.status_code, response.json()) == (200, {})
    assert nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_card_callback_answers_inline_and_may_enqueue_follow_up_work() -> None:
    from feishu_inbox import ledger

    @card_callback()
    def approve(action: feishu.CardAction) -> dict[str, Any]:
        ledger.enqueue(
            event_id=action.envelope.event_id,
            event_type="card.approved",
            partition_key=f"{action.app}:chat:oc_card",
            payload={"by": action.operator_open_id},
        )
        return {"toast": {"type": "success", "content": f"Approved {action.action['value']}"}}

    response = send(card_event())
    assert response.json() == {
        "toast": {"type": "success", "content": "Approved {'do': 'approve'}"}
    }
    assert EventJob.objects.get().payload == {"by": "ou_op"}


@pytest.mark.django_db
def test_slow_or_failing_card_callback_answers_empty_within_the_budget() -> None:
    release = threading.Event()

    @card_callback("default")
    def slow(action: feishu.CardAction) -> dict[str, Any]:
        release.wait(10)
        return {"toast": {}}

    with override_settings(FEISHU_INBOX={"APPS": APPS, "CARD_CALLBACK_BUDGET_SECONDS": 0.2}):
        started = time.monotonic()
        response = send(card_event())
        release.set()
    assert response.json() == {}
    # The promise: answered within CARD_CALLBACK_BUDGET_SECONDS (0.2 s here) and the request's
    # own cost, about 0.25 s idle; a budget not kept would wait for the callback's 10 s.
    assert time.monotonic() - started < 5

    @card_callback("default")
    def broken(action: feishu.CardAction) -> dict[str, Any]:
        raise RuntimeError("boom")

    assert send(card_event()).json() == {}


# --- the database unavailable ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_database_unavailable_is_503_and_nothing_half_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body, headers = delivery(message_event())
    cause = "locked" if connection.vendor == "sqlite" else "refused"
    counted = telemetry.DATABASE_OUTAGES.labels("default", "webhook", cause)
    before = counted._value.get() if hasattr(counted, "_value") else None
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        # Another process holds the write lock longer than our busy timeout.
        connection.close()
        saved = dict(db["OPTIONS"])
        db["OPTIONS"] = {**saved, "timeout": 0.2}
        holder = sqlite3.connect(db["NAME"], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            response = post(body, headers)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
            connection.close()
            db["OPTIONS"] = saved
    else:
        connection.close()
        saved_port = db["PORT"]
        db["PORT"] = "1"  # nothing listens there: the server is gone
        try:
            response = post(body, headers)
        finally:
            connection.close()
            db["PORT"] = saved_port
    assert response.status_code == 503
    assert response.json()["error"] == "database_unavailable"
    assert response["Retry-After"]
    assert nothing_stored()
    # The log line says the database's own words and its cause, and the cause is counted.
    line = next(r.getMessage() for r in caplog.records if "database unavailable" in r.message)
    assert f"({cause})" in line, line
    words = "database is locked" if connection.vendor == "sqlite" else "connection"
    assert words in line.lower(), line
    if before is not None:
        assert counted._value.get() == before + 1
    # Feishu redelivers; now it is stored.
    assert post(body, headers).status_code == 200
    assert EventJob.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgres_only")
def test_twenty_concurrent_deliveries_of_one_event_are_one_job() -> None:
    body, headers = delivery(message_event())
    statuses: list[int] = []
    start = threading.Barrier(20)

    def deliver() -> None:
        try:
            start.wait(10)
            statuses.append(post(body, headers).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert statuses == [200] * 20
    assert EventJob.objects.count() == 1


@pytest.mark.django_db  # Django 6.1's JSONField check queries the database
def test_system_check_warns_when_an_app_has_no_secrets() -> None:
    with override_settings(FEISHU_INBOX={"APPS": {"default": {}}}):
        assert "feishu_inbox.W003" in [m.id for m in run_checks()]
    with override_settings(FEISHU_INBOX={"APPS": {}}):
        assert "feishu_inbox.W003" in [m.id for m in run_checks()]
    assert "feishu_inbox.W003" not in [m.id for m in run_checks()]


@pytest.mark.django_db(transaction=True)
def test_payload_the_database_cannot_store_is_400_not_503() -> None:
    envelope = message_event()
    envelope["event"]["note"] = "nul \u0000 byte"  # a NUL: PostgreSQL's jsonb refuses it
    raw = json.dumps(envelope).encode()
    if connection.vendor != "postgresql":
        assert send(envelope).status_code == 200  # SQLite stores any JSON text
        return
    assert b"\\u0000" in raw
    response = send(envelope)
    assert (response.status_code, response.json()["error"]) == (400, "unstorable_payload")
    assert nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_an_integrity_error_is_400_with_its_traceback_not_503(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise IntegrityError("CHECK constraint failed: feishu_inbox_job_status_valid")

    monkeypatch.setattr(inbound, "store", refused)
    response = send(message_event())
    assert (response.status_code, response.json()["error"]) == (400, "unstorable_payload")
    assert "(feishu_inbox_job_status_valid)" in response.json()["message"]  # what it refused
    record = next(r for r in caplog.records if "integrity error" in r.getMessage())
    assert record.exc_info is not None  # logged with its traceback
    assert nothing_stored()


def test_a_row_checks_refusal_names_what_it_refused_on_either_database() -> None:
    sqlite_words = {
        'CHECK constraint failed: (JSON_VALID("payload") OR "payload" IS NULL)': "payload",
        "NOT NULL constraint failed: feishu_inbox_eventjob.event_type": "event_type",
        "CHECK constraint failed: feishu_inbox_job_status_valid": "feishu_inbox_job_status_valid",
        "something else entirely": "",
    }
    for words, named in sqlite_words.items():
        assert inbound.refused_by(IntegrityError(words)) == named, words

    class Diag:
        column_name = None
        constraint_name = "feishu_inbox_job_attempt_check"

    class PgError(Exception):
        diag = Diag()

    try:
        raise IntegrityError("new row violates check constraint") from PgError()
    except IntegrityError as exc:
        assert inbound.unstorable(exc) == (
            "A row check of the ledger refused the event (feishu_inbox_job_attempt_check)."
        )


def test_a_database_failure_is_told_in_its_own_words_without_its_password() -> None:
    cause, words = database_failure(
        OperationalError(
            'connection to server at "db" failed: FATAL: sorry, too many clients already\n'
            "password=hunter2 postgres://app:hunter2@db/x"
        )
    )
    assert (cause, words) == (
        "too_many_clients",
        'connection to server at "db" failed: FATAL: sorry, too many clients already',
    )
    assert (
        "hunter2"
        not in database_failure(
            OperationalError("could not connect: postgres://app:hunter2@db/x password=hunter2")
        )[1]
    )
    assert database_failure(OperationalError("database is locked"))[0] == "locked"


# --- absurd nesting: refused without recursion, before or without parsing --------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "case", ["unsigned_plain", "unsigned_to_encrypted_app", "signed_encrypted", "depth_65"]
)
def test_absurdly_nested_json_is_400_never_500(case: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    if case == "unsigned_plain":
        body, headers, url = deep, {}, "/feishu/plain/events/"
    elif case == "unsigned_to_encrypted_app":  # no key yet known to the sender: parsed first
        body, headers, url = deep, {}, URL
    elif case == "signed_encrypted":  # a genuine delivery whose event nests ~956 deep
        event = message_event()
        event["event"]["extra"] = "DEEP"  # spliced in as text: json.dumps of the nested lists
        # would need ~950 frames, more than a pytest-xdist process has left under the limit
        text = json.dumps(event).replace('"DEEP"', "[" * 950 + "]" * 950)
        body, headers = delivery(text.encode())
        url = URL
    else:  # one level past the documented limit
        event = message_event()
        event["event"]["extra"] = json.loads("[" * 63 + "]" * 63)  # 65 with the envelope's two
        body, headers = delivery(json.dumps(event).encode())
        url = URL
    response = post(body, headers, url=url)
    assert response.status_code == 400
    assert response.json()["error"] == "too_deep"
    assert "64 levels" in response.json()["message"]
    assert nothing_stored()


@pytest.mark.django_db
def test_nesting_within_the_limit_is_stored() -> None:
    event = message_event()
    event["event"]["extra"] = json.loads("[" * 62 + "]" * 62)  # 64 with the envelope's two
    assert send(event).status_code == 200
    assert EventJob.objects.count() == 1


@pytest.mark.django_db
def test_a_bad_signature_is_refused_before_the_body_is_parsed() -> None:
    body = b"[" * 100_000  # not even JSON: the signature check comes first
    response = post(body, signed_headers(body, "another key"))
    assert (response.status_code, response.json()["error"]) == (401, "bad_signature")
