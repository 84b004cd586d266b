"""The demo bot: an echo-style turn that shows ``checkpoint()`` and ``effect()``.

Autodiscovered (a ``feishu_handlers`` module of an installed app). When the app has Open API
credentials (``FEISHU_APP_ID`` and ``FEISHU_APP_SECRET`` in the environment) it replies in the
chat for real, through ``feishu_inbox.reply`` (an idempotent effect: a crash never sends it
twice); without them its "reply" is a row in ``demo.Reply`` and a log line, so it runs without
network access.
"""

from __future__ import annotations

import json
import logging

import feishu_inbox
from feishu_inbox.feishu import openapi

from .models import Reply
from .tasks import tally_replies

log = logging.getLogger("feishu_inbox.demo")


@feishu_inbox.handler("im.message.receive_v1")
def echo(event: feishu_inbox.Event) -> None:
    message = event.payload.get("event", {}).get("message", {})
    try:
        text = json.loads(message.get("content") or "{}").get("text", "")
    except ValueError:
        text = ""
    # 1. Think. Safe to repeat after a crash: no effect yet.
    answer = f"You said: {text}" if text else "I can only read text messages."
    if text.strip().lower() == "tally":
        # A background task (project/demo/tasks.py). Not an effect: a retry of this handler
        # enqueues it again, which a count can afford; a task that must run once is enqueued
        # with an ordering key inside an effect, or from a view's transaction.
        result = tally_replies.enqueue()
        answer = f"Counting the replies: task {result.id} (admin: the ledger, kind task)."
    # 2. A newer direct message from the same user? Stop here, answer that one instead.
    feishu_inbox.checkpoint()
    # 3. The reply: recorded as started before it happens. Through Feishu, a crash or a dropped
    #    connection re-sends it with the same uuid (Feishu keeps one message) ...
    if event.app in openapi.sending_apps():
        message_id = feishu_inbox.reply(event, answer)
        log.info("replied to %s in %s: %s", event.event_id, message.get("chat_id"), message_id)
        return
    # ... as a row here, it is never repeated automatically (a crash inside ends it unknown).
    with feishu_inbox.effect():
        Reply.objects.create(job_id=event.job_id, chat=message.get("chat_id", "?"), text=answer)
        log.info("replied to %s in %s: %s", event.event_id, message.get("chat_id"), answer)
