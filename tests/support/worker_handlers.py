"""Handlers for the worker tests, loaded by ``runworker`` via FEISHU_INBOX_HANDLERS.

A job's payload lists its steps; the handler records what it does to
``$WORKER_TEST_DIR/events.log`` (one short line per write, appended), so a test can wait on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import feishu_inbox
from feishu_inbox import Event

DIR = Path(os.environ.get("WORKER_TEST_DIR", "."))


def record(*parts: object) -> None:
    with open(DIR / "events.log", "a") as log:
        log.write(" ".join(str(p) for p in parts) + "\n")


def gate_open(name: str) -> bool:
    return (DIR / f"gate-{name}").exists()


def wait_gate(name: str) -> None:
    deadline = time.monotonic() + 120
    while not gate_open(name):  # the test opens the gate: a condition, polled
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {name} never opened")
        time.sleep(0.01)


@feishu_inbox.handler("test.steps")
def steps(event: Event) -> None:
    pid = os.getpid()
    record("start", event.event_id, pid, time.monotonic_ns(), event.attempt)
    for step in event.payload.get("steps", []):
        kind, _, arg = step.partition(":")
        if kind == "gate":
            wait_gate(arg)
        elif kind == "effect":
            with feishu_inbox.effect():
                record("effect", event.event_id, pid)
        elif kind == "effect_gate":
            with feishu_inbox.effect():
                record("in_effect", event.event_id, pid)
                wait_gate(arg)
        elif kind == "fail":
            raise ValueError(arg or "boom")
        elif kind == "checkpoint":
            feishu_inbox.checkpoint()
        elif kind == "until_superseded":
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                feishu_inbox.checkpoint()
                time.sleep(0.02)
            raise TimeoutError("never superseded")
        elif kind == "work":  # the handler's own work (an LLM call, say), arg seconds
            time.sleep(float(arg))
        elif kind == "checkpoints":  # checkpoints between pieces of work for arg seconds
            deadline = time.monotonic() + float(arg)
            while time.monotonic() < deadline:
                feishu_inbox.checkpoint()
                time.sleep(0.02)
        elif kind == "swallow_checkpoint":  # checkpoints for 5 s, each in a broad except
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    feishu_inbox.checkpoint()
                except Exception:
                    record("swallowed", event.event_id, pid)
                time.sleep(0.02)
        elif kind == "swallow_everything":  # even BaseException: effect() must still refuse
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    feishu_inbox.checkpoint()
                except BaseException:
                    record("swallowed", event.event_id, pid)
                    break
                time.sleep(0.02)
        elif kind == "exit":
            raise SystemExit(arg or "a handler called sys.exit")
        elif kind == "interrupt":
            raise KeyboardInterrupt(arg or "a handler raised KeyboardInterrupt")
        elif kind == "retry_after" and event.attempt == 1:  # first attempt only
            raise feishu_inbox.RetryAfter(float(arg))
        elif kind == "retry_at" and event.attempt == 1:
            from django.utils import timezone

            raise feishu_inbox.RetryAt(timezone.now() + timedelta(seconds=float(arg)))
        elif kind == "step":  # a memoized step; "ran" is written when its function runs
            feishu_inbox.step(arg, lambda arg=arg: _ran(event, arg))
        elif kind == "step_fails_once":  # a step whose function raises on the first attempt
            feishu_inbox.step(arg, lambda arg=arg: _ran(event, arg, fail=event.attempt == 1))
        elif kind == "step_gate":  # a step that waits for the gate of its name, inside
            feishu_inbox.step(arg, lambda arg=arg: _ran(event, arg, gate=arg))
        elif kind == "break_heartbeat":  # a bug in this worker's heartbeat: its next renewal
            from feishu_inbox.ledger import rules  # raises what nothing there expects

            def renew(*args: object, **kwargs: object) -> None:
                raise RuntimeError("a bug in the heartbeat")

            rules.renew = renew  # type: ignore[assignment]
        elif kind == "wait":  # a durable wait for the signal arg (SPEC §9e)
            got = feishu_inbox.wait_for(arg, timeout=None)
            record("waited", event.event_id, json.dumps(got, separators=(",", ":")), pid)
        elif kind == "sleep":  # a durable sleep of arg seconds
            feishu_inbox.sleep(float(arg))
            record("slept", event.event_id, pid)
        elif kind == "os_exit":
            record("dying", event.event_id, pid)
            os._exit(3)
    record("end", event.event_id, pid, time.monotonic_ns())


def _ran(event: Event, name: str, *, fail: bool = False, gate: str = "") -> str:
    record("step_start", event.event_id, name, event.attempt)
    if gate:
        wait_gate(gate)
    if fail:
        raise ValueError(f"step {name} fails on attempt {event.attempt}")
    record("ran", event.event_id, name, event.attempt)
    return f"{name}-result"


@feishu_inbox.handler("test.async")
async def async_steps(event: Event) -> None:
    pid = os.getpid()
    record("start", event.event_id, pid, time.monotonic_ns(), event.attempt)
    await asyncio.sleep(0)
    if "interrupt" in event.payload.get("steps", []):
        raise KeyboardInterrupt("an async handler raised KeyboardInterrupt")
    feishu_inbox.checkpoint()
    async with feishu_inbox.effect():
        record("effect", event.event_id, pid)
    record("end", event.event_id, pid, time.monotonic_ns())


@feishu_inbox.handler("test.reply")
def reply(event: Event) -> None:
    """Think a little, then reply through the Open API (the fake of the test): payload
    ``text``, and optionally ``window``/``margin`` seconds of the reply's idempotency."""
    pid = os.getpid()
    record("start", event.event_id, pid, time.monotonic_ns(), event.attempt)
    time.sleep(float(event.payload.get("think", 0)))  # the handler's own work (an LLM call)
    window = event.payload.get("window")
    margin = event.payload.get("margin")
    feishu_inbox.reply(
        event,
        event.payload["text"],
        idempotent_for=timedelta(seconds=window) if window else timedelta(hours=1),
        margin=None if margin is None else timedelta(seconds=margin),
    )
    record("replied", event.event_id, pid, event.attempt)


#: The same steps under a timeout of 1.5 s (the timeout tests).
feishu_inbox.handler("test.timed", timeout=timedelta(seconds=1.5))(steps)


#: The same steps, each attempt taking a token of a limit of 4 a second for the whole app.
feishu_inbox.handler("test.limited", rate_limit=feishu_inbox.RateLimit("t:{app}", 4, burst=1))(
    steps
)


#: The same steps, at most 2 jobs of one tenant running at once, across workers.
feishu_inbox.handler("test.concurrent", concurrency=("tenant:{tenant_key}", 2))(steps)

#: The same steps, one job of a tenant at a time (the parking tests).
feishu_inbox.handler("test.concurrent_one", concurrency=("solo:{tenant_key}", 1))(steps)


def answer_words(event_id: str, words: int) -> list[str]:
    """The answer a model gives to event ``event_id`` (what the stream tests write)."""
    return [f"{event_id}-w{i} " for i in range(words)]


@feishu_inbox.handler("test.stream")
def stream(event: Event) -> None:
    """Think (a step: the answer is memoized), then stream the answer into a card reply, a
    word every ``pace`` seconds (a model's tokens)."""
    pid = os.getpid()
    words = feishu_inbox.step(
        "think", answer_words, event.event_id, int(event.payload.get("words", 40))
    )
    pace = float(event.payload.get("pace", 0.02))
    with feishu_inbox.stream_reply(event, title="Answer") as card:
        record("stream", event.event_id, pid, event.attempt, len(card.seen))
        for word in words:
            card.write(word)
            time.sleep(pace)  # the model's pace
    record("streamed", event.event_id, pid, event.attempt)


async def async_stuck(event: Event) -> None:
    """Awaits for a minute: a hung async call (its timeout cancels it at this await)."""
    record("start", event.event_id, os.getpid(), time.monotonic_ns(), event.attempt)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        record("cancelled", event.event_id, os.getpid())
        raise
    record("end", event.event_id, os.getpid(), time.monotonic_ns())


#: An async handler under a timeout of 1.5 s.
feishu_inbox.handler("test.async_timed", timeout=timedelta(seconds=1.5))(async_stuck)


@feishu_inbox.handler("test.ask")
def ask(event: Event) -> None:
    """Ask ``question`` in a card (SPEC §9e) with ``choices``, ``timeout`` seconds and ``who``;
    record the answer (or the expiry), then wait for the gate ``gate`` if the payload names
    one (a test kills the worker there)."""
    pid = os.getpid()
    record("start", event.event_id, pid, time.monotonic_ns(), event.attempt)
    p = event.payload
    try:
        answer = feishu_inbox.ask(
            event,
            p.get("question", "Delete these 40 records?"),
            choices=p.get("choices", ["Approve", "Reject"]),
            timeout=p.get("timeout", 600),
            who=p.get("who"),
        )
    except feishu_inbox.QuestionExpired:
        record("expired", event.event_id, pid)
        raise
    record("answered", event.event_id, answer.choice, answer.open_id, pid)
    if p.get("gate"):
        wait_gate(p["gate"])
    record("end", event.event_id, pid, time.monotonic_ns())


# --- workflows (SPEC §9f) ------------------------------------------------------------------------


@feishu_inbox.handler("test.fanout")
def fanout(event: Event) -> None:
    """Spawn ``n`` children of ``child`` (their payload: ``i``, and ``steps``), wait for all of
    them, then one effect of the parent's own. ``cancel_wait``: the children loop on
    checkpoints until cancelled (the cancel tests)."""
    pid = os.getpid()
    n = int(event.payload["n"])
    child = event.payload.get("child", "test.wf_child")
    steps = event.payload.get("steps", [])
    kids = feishu_inbox.spawn_many(child, [{"i": i, "steps": steps} for i in range(n)])
    record("spawned", event.event_id, len(kids), pid)
    results = feishu_inbox.wait_all(kids)
    ok = sum(1 for r in results if r.ok)
    values = sorted(r.result["i"] for r in results if r.ok)
    record("resumed", event.event_id, len(results), ok, int(values == list(range(n))), pid)
    with feishu_inbox.effect("parent", idempotent_for=timedelta(hours=1)) as key:
        record("parent_effect", event.event_id, key, pid)


@feishu_inbox.handler("test.wf_child")
def wf_child(event: Event) -> dict[str, int]:
    """A child (or batch member, or chain link): its steps (``test.steps``'s words: gate,
    checkpoints, work), then an effect the remote side deduplicates by its key (recorded, so
    a test counts what was applied), then its result: ``{"i": …}`` (a link: previous + 1)."""
    pid = os.getpid()
    record("child_start", event.event_id, pid, event.attempt)
    for step in event.payload.get("steps", []):
        kind, _, arg = step.partition(":")
        if kind == "gate":
            wait_gate(arg)
        elif kind == "checkpoints":
            deadline = time.monotonic() + float(arg)
            while time.monotonic() < deadline:
                feishu_inbox.checkpoint()
                time.sleep(0.02)
            raise TimeoutError("never cancelled")
        elif kind == "work":
            time.sleep(float(arg))
    with feishu_inbox.effect("apply", idempotent_for=timedelta(hours=1)) as key:
        record("child_effect", event.event_id, key, pid)
    previous = event.payload.get("previous")
    if isinstance(previous, dict):
        return {"i": int(previous["i"]) + 1}
    return {"i": int(event.payload.get("i", 0))}


@feishu_inbox.handler("test.wf_callback")
def wf_callback(event: Event) -> None:
    """A batch's callback: records its batch and what it was told."""
    summary = event.payload["batch"]
    record(
        "callback",
        summary["id"],
        event.payload.get("which", "?"),
        summary["total"],
        json.dumps(summary["counts"], separators=(",", ":"), sort_keys=True),
        os.getpid(),
    )


@feishu_inbox.handler("test.task_parent")
def task_parent(event: Event) -> None:
    """Spawn ``n`` django.tasks children (``worker_tasks.add(i, 100)``) and sum their results."""
    from tests.support import worker_tasks

    n = int(event.payload["n"])
    kids = feishu_inbox.spawn_many(worker_tasks.add, [[i, 100] for i in range(n)])
    results = feishu_inbox.wait_all(kids)
    record("task_sum", event.event_id, sum(r.value for r in results))
