"""The Open API client against a local fake of Feishu (tests/support/fake_feishu.py): one client per
app, tokens fetched once per expiry, every failure typed, and a re-send with the same uuid
harmless."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import lark_oapi
import pytest
from django.conf import settings
from django.test import override_settings
from lark_oapi.api.im.v1 import CreateMessageRequest, CreateMessageRequestBody

from feishu_inbox.errors import (
    ConfigurationError,
    FeishuAPIError,
    FeishuBusinessError,
    FeishuRateLimited,
    FeishuTransientError,
    InvalidMessage,
)
from feishu_inbox.feishu import openapi
from tests.support.fake_feishu import (
    BUSINESS_ERROR,
    DROP_AFTER_APPLY,
    RATE_LIMIT,
    SERVER_ERROR,
    FakeFeishu,
    Fault,
)

# No test database here (a SQLite file of its own at most): the SQLite suite runs it once.
pytestmark = pytest.mark.any_database


def app_id(app: str) -> str:
    return str(settings.FEISHU_INBOX["APPS"][app]["APP_ID"])


def send(n: int = 0, app: str = "bot", **kwargs: Any) -> str:
    return openapi.send_message(app, "oc_chat", f"hello {n}", uuid=f"send-{n}", **kwargs)


def raises(fn: Callable[[], object]) -> FeishuAPIError:
    with pytest.raises(FeishuAPIError) as caught:
        fn()
    return caught.value


# --- the client ---------------------------------------------------------------------------


def test_one_client_per_app_shared_by_threads(fake_feishu: FakeFeishu) -> None:
    seen: list[object] = []
    threads = [
        threading.Thread(target=lambda: seen.append(openapi.client("bot"))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bot = openapi.client("bot")
    assert isinstance(bot, lark_oapi.Client)
    assert all(c is bot for c in seen)
    assert openapi.client("other") is not bot
    assert (bot.config.app_id, bot.config.domain) == (app_id("bot"), fake_feishu.url)


def test_changed_settings_build_a_new_client(fake_feishu: FakeFeishu) -> None:
    before = openapi.client("bot")
    apps = {"bot": {**settings.FEISHU_INBOX["APPS"]["bot"], "APP_SECRET": "rotated"}}
    with override_settings(FEISHU_INBOX={"APPS": apps}):
        assert openapi.client("bot") is not before
        assert openapi.client("bot").config.app_secret == "rotated"


def test_unknown_app_or_missing_credentials_is_a_configuration_error(
    fake_feishu: FakeFeishu,
) -> None:
    with pytest.raises(ConfigurationError, match="No Feishu app 'nope'"):
        openapi.client("nope")
    with (
        override_settings(FEISHU_INBOX={"APPS": {"bot": {"VERIFICATION_TOKEN": "t"}}}),
        pytest.raises(ConfigurationError, match="no APP_ID and APP_SECRET"),
    ):
        openapi.send_message("bot", "oc_chat", "hi", uuid="u")
    assert fake_feishu.counts()["message_requests"] == 0


def test_the_client_is_the_escape_hatch_and_shares_the_token(fake_feishu: FakeFeishu) -> None:
    send(1)
    request = (
        CreateMessageRequest.builder()
        .receive_id_type("chat_id")
        .request_body(
            CreateMessageRequestBody.builder()
            .receive_id("oc_chat")
            .msg_type("text")
            .content(json.dumps({"text": "through the SDK"}))
            .build()
        )
        .build()
    )
    response = openapi.client("bot").im.v1.message.create(request)
    assert response.success(), response.msg
    assert fake_feishu.messages[-1].message_id == response.data.message_id
    assert fake_feishu.token_requests(app_id("bot")) == 1


# --- tenant access tokens -----------------------------------------------------------------


def test_the_token_is_fetched_once_for_many_messages(fake_feishu: FakeFeishu) -> None:
    first = send(0)
    for n in range(1, 30):
        send(n)
        openapi.reply_message("bot", first, f"reply {n}", uuid=f"reply-{n}")
    assert len(fake_feishu.messages) == 59
    assert fake_feishu.token_requests(app_id("bot")) == 1


def test_threads_starting_at_once_fetch_one_token(fake_feishu: FakeFeishu) -> None:
    """The SDK's cache has no lock of its own; without openapi's, each thread would fetch."""
    start = threading.Barrier(16)
    errors: list[BaseException] = []

    def one(n: int) -> None:
        start.wait()
        try:
            send(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(fake_feishu.messages) == 16
    assert fake_feishu.token_requests(app_id("bot")) == 1


def test_each_app_fetches_its_own_token_once(fake_feishu: FakeFeishu) -> None:
    for n in range(5):
        send(n, app="bot")
        send(n, app="other")
    assert fake_feishu.token_requests(app_id("bot")) == 1
    assert fake_feishu.token_requests(app_id("other")) == 1
    assert {m.app_id for m in fake_feishu.messages} == {app_id("bot"), app_id("other")}


def test_the_token_is_fetched_again_after_it_expires(fake_feishu: FakeFeishu) -> None:
    """The SDK keeps a token until 10 minutes before its expiry (to the whole second below): a
    token that lives 605 s is kept for more than 4 s and at most 5 s, then fetched anew. (At
    602 s, kept 1-2 s, two sends on a machine whose every core is busy could straddle it.)"""
    fake_feishu.token_expire = 605
    send(0)
    send(1)
    assert fake_feishu.token_requests(app_id("bot")) == 1
    time.sleep(5.05)  # the token's life passing: the stimulus, not a synchronisation
    send(2)
    send(3)
    assert fake_feishu.token_requests(app_id("bot")) == 2
    assert len(fake_feishu.messages) == 4


def test_a_revoked_token_is_fetched_anew_once(fake_feishu: FakeFeishu) -> None:
    send(0)
    fake_feishu.revoke_tokens()
    send(1)  # refused with 99991663, then sent again (same uuid) with a fresh token
    assert fake_feishu.token_requests(app_id("bot")) == 2
    assert [r.outcome for r in fake_feishu.requests] == ["created", "refused", "created"]


# --- failures -------------------------------------------------------------------------------


def test_rate_limit_carries_the_reset_time_from_the_headers(fake_feishu: FakeFeishu) -> None:
    fake_feishu.fail_next(Fault("rate_limit", reset_seconds=30))
    before = datetime.now(timezone.utc)
    error = raises(send)
    after = datetime.now(timezone.utc)
    assert isinstance(error, FeishuRateLimited)
    assert error.retryable and not error.maybe_applied
    assert (error.status, error.feishu_code) == (429, 99991400)
    # 30 s from when the answer came, some time inside the call (however long a loaded
    # machine made it)
    assert before + timedelta(seconds=30) <= error.reset_at <= after + timedelta(seconds=30)
    assert error.reset_at.tzinfo is not None
    assert fake_feishu.messages == []


def test_rate_limit_on_http_400_without_headers_waits_the_default(
    fake_feishu: FakeFeishu,
) -> None:
    """Older APIs answer a rate limit with HTTP 400; no reset header: the documented default."""
    fake_feishu.fail_next(Fault("rate_limit", status=400, reset_seconds=None))
    before = datetime.now(timezone.utc)
    error = raises(send)
    after = datetime.now(timezone.utc)
    assert isinstance(error, FeishuRateLimited)
    # the default from when the answer came, inside the call (a stress round made it 2.3 s)
    wait = openapi.RATE_LIMIT_DEFAULT_WAIT
    assert before + wait <= error.reset_at <= after + wait, (before, error.reset_at, after)


def test_server_error_is_transient_and_created_nothing(fake_feishu: FakeFeishu) -> None:
    fake_feishu.fail_next(SERVER_ERROR)
    error = raises(send)
    assert isinstance(error, FeishuTransientError)
    assert error.retryable and error.status == 500
    assert fake_feishu.messages == []
    send()  # the same uuid, again
    assert len(fake_feishu.messages) == 1


def test_an_unreadable_answer_is_transient(fake_feishu: FakeFeishu) -> None:
    fake_feishu.fail_next(Fault("garbled"))
    error = raises(send)
    assert isinstance(error, FeishuTransientError) and error.maybe_applied
    send()
    assert len(fake_feishu.messages) == 1


def test_business_error_carries_feishus_code_and_msg(fake_feishu: FakeFeishu) -> None:
    fake_feishu.fail_next(BUSINESS_ERROR)
    error = raises(send)
    assert isinstance(error, FeishuBusinessError)
    assert not error.retryable and not error.maybe_applied
    assert (error.status, error.feishu_code) == (400, 230002)
    assert error.feishu_msg == "Bot/User can NOT be out of the chat."
    assert "230002" in str(error) and "out of the chat" in str(error)
    assert error.log_id.startswith("fake")
    assert error.code == "feishu_business" and error.fix


def test_a_dropped_connection_after_sending_is_transient_and_a_resend_is_harmless(
    fake_feishu: FakeFeishu,
) -> None:
    fake_feishu.fail_next(DROP_AFTER_APPLY)
    error = raises(send)
    assert isinstance(error, FeishuTransientError)
    assert error.maybe_applied and error.status is None
    [created] = fake_feishu.messages
    assert send() == created.message_id  # same uuid: Feishu answers the first message
    assert len(fake_feishu.messages) == 1
    assert [r.outcome for r in fake_feishu.requests] == ["drop_after_apply", "duplicate"]


def test_a_timeout_is_transient(fake_feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openapi, "REQUEST_TIMEOUT", 0.3)
    fake_feishu.fail_next(Fault("slow_after_apply", delay=1.0))
    error = raises(send)
    assert isinstance(error, FeishuTransientError) and error.maybe_applied
    assert "Timeout" in error.message
    assert send() == fake_feishu.messages[0].message_id
    assert len(fake_feishu.messages) == 1


def test_an_unreachable_server_is_transient_and_sent_nothing(fake_feishu: FakeFeishu) -> None:
    closed = FakeFeishu().start()
    url = closed.url
    closed.stop()  # its port now refuses connections
    apps = {"bot": {**settings.FEISHU_INBOX["APPS"]["bot"], "DOMAIN": url}}
    with override_settings(FEISHU_INBOX={"APPS": apps}):
        error = raises(send)
    assert isinstance(error, FeishuTransientError)
    assert not error.maybe_applied  # the token could not be fetched: no message request
    assert "tenant access token" in error.message


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (RATE_LIMIT, FeishuRateLimited),
        (SERVER_ERROR, FeishuTransientError),
        (Fault("business_error", code=10014, msg="app secret invalid"), FeishuBusinessError),
    ],
)
def test_token_endpoint_failures_are_typed_and_sent_no_message(
    fake_feishu: FakeFeishu, fault: Fault, expected: type[FeishuAPIError]
) -> None:
    fake_feishu.fail_next(fault, endpoint="token")
    error = raises(send)
    assert type(error) is expected and not error.maybe_applied
    assert fake_feishu.counts()["message_requests"] == 0
    send()  # the next try fetches the token and sends
    assert len(fake_feishu.messages) == 1


def test_a_wrong_app_secret_is_a_business_error_naming_the_settings(
    fake_feishu: FakeFeishu,
) -> None:
    apps = {"bot": {**settings.FEISHU_INBOX["APPS"]["bot"], "APP_SECRET": "wrong"}}
    with override_settings(FEISHU_INBOX={"APPS": apps}):
        error = raises(send)
    assert isinstance(error, FeishuBusinessError) and error.feishu_code == 10014
    assert "APP_SECRET" in error.fix


# --- arguments and content ------------------------------------------------------------------


def test_invalid_arguments_name_every_problem_and_send_nothing(fake_feishu: FakeFeishu) -> None:
    with pytest.raises(InvalidMessage) as caught:
        openapi.send_message("bot", "", "hi", receive_id_type="chat", msg_type="txt", uuid="u" * 51)
    problems = caught.value.problems
    assert len(problems) == 4, problems
    assert any("uuid" in p and "50" in p for p in problems)
    assert any("receive_id_type" in p and "open_id" in p for p in problems)
    assert any("msg_type" in p for p in problems)
    assert any("receive_id must be" in p for p in problems)
    assert isinstance(caught.value, ValueError) and caught.value.code == "invalid_argument"
    with pytest.raises(InvalidMessage, match="uuid"):
        openapi.reply_message("bot", "om_1", "hi", uuid="")
    with pytest.raises(InvalidMessage, match="reply_in_thread"):
        openapi.reply_message("bot", "om_1", "hi", reply_in_thread="yes", uuid="u")  # type: ignore[arg-type]
    assert fake_feishu.counts() == {"token_requests": 0, "message_requests": 0, "messages": 0}


@pytest.mark.parametrize(
    ("content", "msg_type", "sent"),
    [
        ("hi", "text", {"text": "hi"}),
        ('{"text": "not parsed"}', "text", {"text": '{"text": "not parsed"}'}),
        ({"text": "hi"}, "text", {"text": "hi"}),
        (
            {"zh_cn": {"title": "T", "content": []}},
            "post",
            {"zh_cn": {"title": "T", "content": []}},
        ),
        ('{"elements": []}', "interactive", {"elements": []}),
        ({"elements": [{"tag": "markdown", "content": "中文"}]}, "interactive", None),
    ],
)
def test_content_is_sent_as_feishus_json_string(
    fake_feishu: FakeFeishu, content: Any, msg_type: str, sent: dict[str, Any] | None
) -> None:
    openapi.send_message("bot", "oc_chat", content, msg_type=msg_type, uuid="u")
    [message] = fake_feishu.messages
    assert message.msg_type == msg_type
    assert json.loads(message.content) == (content if sent is None else sent)
    if sent is None:
        assert "中文" in message.content  # sent as UTF-8, not \\u escapes


@pytest.mark.parametrize(
    ("content", "msg_type", "problem"),
    [
        ("", "text", "non-empty"),
        ({"title": "no text"}, "text", "non-empty"),
        ("not json", "interactive", "JSON string of an object"),
        ("[1, 2]", "post", "JSON string of an object"),
        ({"when": datetime.now()}, "interactive", "not JSON-serialisable"),
        (["a list"], "text", "dict or a str"),
    ],
)
def test_bad_content_is_refused(
    fake_feishu: FakeFeishu, content: Any, msg_type: str, problem: str
) -> None:
    with pytest.raises(InvalidMessage, match=problem):
        openapi.send_message("bot", "oc_chat", content, msg_type=msg_type, uuid="u")


def test_body_size_limits(fake_feishu: FakeFeishu) -> None:
    """150 KB for text, 30 KB for cards and rich text: the request body, as Feishu counts it."""
    overhead = len(json.dumps({"receive_id": "oc_chat", "msg_type": "text", "uuid": "u"}))
    text_room = 150 * 1024 - overhead - len(', "content": ') - len(json.dumps('{"text":""}'))
    openapi.send_message("bot", "oc_chat", "x" * text_room, uuid="u")  # accepted by both
    with pytest.raises(InvalidMessage, match="150 KB"):
        openapi.send_message("bot", "oc_chat", "x" * (text_room + 1), uuid="u2")
    card = {"elements": [{"tag": "markdown", "content": "x" * 30 * 1024}]}
    with pytest.raises(InvalidMessage, match="30 KB for a interactive"):
        openapi.send_message("bot", "oc_chat", card, msg_type="interactive", uuid="u3")
    assert len(fake_feishu.messages) == 1


def test_reply_in_thread_and_receive_id_types_reach_feishu(fake_feishu: FakeFeishu) -> None:
    fake_feishu.add_inbound("om_user", "oc_team")
    reply = openapi.reply_message("bot", "om_user", "in the thread", reply_in_thread=True, uuid="r")
    openapi.send_message("bot", "ou_someone", "direct", receive_id_type="open_id", uuid="s")
    first, second = fake_feishu.messages
    assert (first.message_id, first.kind, first.parent_id) == (reply, "reply", "om_user")
    assert (first.chat_id, first.reply_in_thread) == ("oc_team", True)
    assert (second.receive_id_type, second.receive_id) == ("open_id", "ou_someone")


# --- many threads, faults and re-sends ------------------------------------------------------


def test_concurrent_sends_with_faults_deliver_each_message_once(fake_feishu: FakeFeishu) -> None:
    """8 threads of 25 messages over two apps, a fault on 30% of first tries, each failure sent
    again with its uuid (as the ledger will): exactly one message per uuid, one token per app."""
    fake_feishu.fail_first_tries(0.3, seed=15)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        for n in range(25):
            uuid, app = f"t{t}-m{n}", ("bot", "other")[n % 2]
            for _ in range(5):
                try:
                    openapi.send_message(app, f"oc_{t}", f"{t}/{n}", uuid=uuid)
                    break
                except (FeishuRateLimited, FeishuTransientError):
                    continue
                except BaseException as exc:
                    errors.append(exc)
                    return

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    uuids = [m.uuid for m in fake_feishu.messages]
    assert len(uuids) == 200 and len(set(uuids)) == 200
    counts = fake_feishu.counts()
    assert counts["drop_after_apply"] + counts["rate_limit"] + counts["server_error"] > 30
    assert counts["duplicate"] == counts["drop_after_apply"]
    assert fake_feishu.token_requests(app_id("bot")) == 1
    assert fake_feishu.token_requests(app_id("other")) == 1
    for t in range(8):  # per chat, in the order each thread sent them
        texts = [
            json.loads(m.content)["text"] for m in fake_feishu.messages if m.chat_id == f"oc_{t}"
        ]
        assert texts == [f"{t}/{n}" for n in range(25)]


def test_the_fake_dedupes_a_uuid_for_its_window_only(fake_feishu: FakeFeishu) -> None:
    # Two sends within the window even on a busy machine (0.3 s was not always), then past it.
    fake_feishu.uuid_window = 3.0
    first = send()
    assert send() == first
    time.sleep(3.05)  # the window passing: the stimulus, not a synchronisation
    assert send() != first
    assert len(fake_feishu.messages) == 2
