"""The LLM bot of the turns tests (``runworker`` loads it via FEISHU_INBOX_HANDLERS): coalesce
a chat's burst, add a "typing" reaction, call a fake model once (a step), stream its answer
into one card with a stop button. Each thing it does is a line of ``$WORKER_TEST_DIR/
events.log``; what a message's text asks for steers it:

- ``slow``: the answer streams a word every 50 ms (a stop lands mid-stream);
- ``gate:NAME``: wait for the test's gate after the model answered (a kill lands in the turn);
  ``midgate:NAME``: halfway through the answer, send what is written (the card shows part of
  it) and wait for the gate (a kill lands mid-stream);
- ``plain``: answer with a plain ``reply`` (no card);
  ``hold``: call ``checkpoint()`` every 10 ms for a minute, or until a message was merged into
  the turn or one of its messages recalled (a cancel or a newer message ends it);
  ``holdfast``: the same until a checkpoint ends it (a cancel, a stop: a recall only flags);
- ``fail``: raise after the model (attempts: TURN_ATTEMPTS); ``unknown``: a plain effect, then
  the process dies inside it; ``sleep``: sleep past the handler's timeout.

TURN_STALE_POLICY (skip, notice, run) is the handler's ``on_stale`` past 30 minutes;
TURN_ON_RECALL (flag, cancel) its ``on_recall``; TURN_OPENAPI_TIMEOUT the Open API's request
timeout in this worker (seconds; the reaction tests make an add time out).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import feishu_inbox
from feishu_inbox import Event
from feishu_inbox.feishu import openapi
from tests.support.worker_handlers import record, wait_gate

WORDS = 30
if "TURN_OPENAPI_TIMEOUT" in os.environ:
    openapi.REQUEST_TIMEOUT = float(os.environ["TURN_OPENAPI_TIMEOUT"])


def model(prompt: str) -> str:
    """The fake model: one line per call, an answer made of the prompt."""
    record("llm", os.getpid(), len(prompt.split()))
    return " ".join(f"w{n}:{prompt.replace(' ', '_')[:20]}" for n in range(WORDS)) + " "


@feishu_inbox.handler(
    "im.message.receive_v1",
    coalesce=feishu_inbox.Coalesce(
        quiet=float(os.environ.get("TURN_QUIET", "0.6")),
        max_wait=float(os.environ.get("TURN_MAX_WAIT", "2.0")),
        during=os.environ.get("TURN_DURING", "queue"),
        on_recalled_reply=os.environ.get("TURN_ON_RECALLED", "drop"),
        on_recall=os.environ.get("TURN_ON_RECALL", "flag"),
    ),
    stale_after=timedelta(minutes=30),
    on_stale=os.environ.get("TURN_STALE_POLICY", "skip"),
    timeout=float(os.environ.get("TURN_TIMEOUT", "60")),
    retry=feishu_inbox.RetryPolicy(
        attempts=int(os.environ.get("TURN_ATTEMPTS", "20")), delay=0.1, max_delay=0.5, jitter=False
    ),
)
def turn(event: Event) -> None:
    pid = os.getpid()
    texts = [m.text for m in event.turn.live]
    record("turn", event.job_id, pid, event.attempt, len(texts), "|".join(texts).replace(" ", "_"))
    feishu_inbox.typing(event)
    answer = feishu_inbox.step("model", model, event.turn.text)
    text = event.turn.text
    for word in text.split():
        if word.startswith("gate:"):
            record("gated", event.job_id, pid)
            wait_gate(word.removeprefix("gate:"))
        if word in ("hold", "holdfast"):  # at a checkpoint every 10 ms until a stop, cancel
            record("gated", event.job_id, pid)  # or newer message (holdfast: a stop or cancel)
            deadline = time.monotonic() + 60
            fast = word == "holdfast"
            while time.monotonic() < deadline and (
                fast or not (event.turn.merged or event.turn.recalled)
            ):
                feishu_inbox.checkpoint()
                time.sleep(0.01)
            record("held", event.job_id, event.turn.merged, len(event.turn.recalled))
    if "fail" in text.split():
        raise ValueError("the handler failed")
    if "unknown" in text.split():
        with feishu_inbox.effect("side"):
            record("side", event.job_id, pid)
            os._exit(3)
    if "sleep" in text.split():
        time.sleep(6)  # past the handler's timeout, in no checkpoint
    if "plain" in text.split():
        feishu_inbox.reply(event, answer)
        record("replied", event.job_id, pid)
        return
    slow = "slow" in text.split()
    middle = [w.removeprefix("midgate:") for w in text.split() if w.startswith("midgate:")]
    with feishu_inbox.stream_reply(event, stop_button=True) as card:
        record("stream", event.job_id, pid)
        for n, word in enumerate(answer.split(" ")):
            card.write(word + " ")
            if middle and n == WORDS // 2:
                card.flush()
                record("midstream", event.job_id, pid, event.attempt)
                wait_gate(middle[0])
            if slow:
                time.sleep(0.05)
    record("streamed", event.job_id, pid, event.turn.merged)
