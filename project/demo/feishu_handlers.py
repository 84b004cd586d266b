"""The demo bot: an echo-style turn that shows ``checkpoint()`` and ``effect()``.

Autodiscovered (a ``feishu_handlers`` module of an installed app). Its "reply" is a row in
``demo.Reply`` and a log line, so it runs without network access.
"""

from __future__ import annotations

import json
import logging

import feishu_inbox

from .models import Reply

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
    # 2. A newer direct message from the same user? Stop here, answer that one instead.
    feishu_inbox.checkpoint()
    # 3. The reply: recorded as started before it happens, never repeated automatically.
    with feishu_inbox.effect():
        Reply.objects.create(job_id=event.job_id, chat=message.get("chat_id", "?"), text=answer)
        log.info("replied to %s in %s: %s", event.event_id, message.get("chat_id"), answer)
