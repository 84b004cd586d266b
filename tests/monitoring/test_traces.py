"""Traces (feishu_inbox/tracing.py) with OpenTelemetry's SDK and its in-memory exporter: a
webhook delivery, the worker's attempt of its job and the reply it sends through the fake of
Feishu's Open API are one trace; without a configured provider nothing is recorded or stored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client, override_settings
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from feishu_inbox import ledger, tracing
from feishu_inbox.models import EventJob
from tests.support import worker_handlers
from tests.support.fake_feishu import FakeFeishu
from tests.support.feishu_client import (
    ENCRYPT_KEY,
    TOKEN,
    delivery,
    django_headers,
    message_event,
)

pytestmark = pytest.mark.django_db(transaction=True)

#: The caller's context the delivery carries (a proxy's or an ingress's span).
UPSTREAM_TRACE, UPSTREAM_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def _set_provider(provider: Any) -> None:
    """Set (or, None, clear) the process's tracer provider: the API sets one only once per
    process, as its own tests reset it."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _set_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _set_provider(None)


@pytest.fixture(autouse=True)
def _log_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_handlers, "DIR", tmp_path)


@pytest.fixture
def fake() -> Iterator[FakeFeishu]:
    from feishu_inbox.feishu import openapi

    with FakeFeishu(apps={"cli_trace_test": "s3cret"}) as fake:
        app = {
            "ENCRYPT_KEY": ENCRYPT_KEY,
            "VERIFICATION_TOKEN": TOKEN,
            "APP_ID": "cli_trace_test",
            "APP_SECRET": "s3cret",
            "DOMAIN": fake.url,
        }
        with override_settings(FEISHU_INBOX={"APPS": {"default": app}}):
            try:
                yield fake
            finally:
                openapi.forget_clients()


def deliver(fake: FakeFeishu, *, traceparent: str = "") -> Any:
    """A signed, encrypted delivery of a "test.reply" event (tests/support/worker_handlers.py:
    it replies with its payload's text) to the webhook, as Feishu sends it."""
    envelope = message_event(message_id="om_in_1", chat_id="oc_1", text="hi")
    envelope["header"]["event_type"] = "test.reply"
    envelope["text"] = "traced reply"
    fake.add_inbound("om_in_1", "oc_1")
    body, headers = delivery(envelope)
    if traceparent:
        headers["traceparent"] = traceparent
    return Client().post(
        "/feishu/events/", body, content_type="application/json", **django_headers(headers)
    )


def run_worker() -> None:
    call_command("runworker", "--burst", "-v", "0")


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    found = {s.name: s for s in exporter.get_finished_spans()}
    assert len(found) == len(exporter.get_finished_spans()), list(found)  # each name once
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_delivery_its_job_and_its_reply_are_one_trace(
    fake: FakeFeishu, spans: InMemorySpanExporter
) -> None:
    answer = deliver(fake, traceparent=f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01")
    assert answer.status_code == 200 and json.loads(answer.content)["ok"]
    job = EventJob.objects.get()
    [receive] = spans.get_finished_spans()
    assert receive.name == "feishu_inbox receive" and receive.kind is SpanKind.SERVER
    context = receive.context
    assert f"{context.trace_id:032x}" == UPSTREAM_TRACE  # the caller's trace goes on
    assert parent_of(receive) == int(UPSTREAM_SPAN, 16)
    assert receive.attributes is not None
    assert receive.attributes["feishu_inbox.job.id"] == job.id
    assert receive.attributes["feishu_inbox.answer"] == "stored"
    # The job keeps the receiving span's context, as a W3C traceparent.
    assert job.trace_parent == f"00-{UPSTREAM_TRACE}-{context.span_id:016x}-01"

    run_worker()
    assert [m.parent_id for m in fake.messages] == ["om_in_1"]
    found = by_name(spans)
    job_span = found["feishu_inbox job test.reply"]
    effect = found["feishu_inbox effect reply"]
    [api_name] = [n for n in found if n.startswith("feishu_inbox openapi POST")]
    api = found[api_name]
    assert "/reply" in api_name and "om_in_1" not in api_name  # the path's template, no id
    for span in (job_span, effect, api):
        assert f"{span.context.trace_id:032x}" == UPSTREAM_TRACE, span.name
    assert parent_of(job_span) == context.span_id  # a child of the delivery's span...
    assert [link.context.span_id for link in job_span.links] == [context.span_id]  # ...linked
    assert parent_of(effect) == job_span.context.span_id
    assert parent_of(api) == effect.context.span_id
    assert job_span.kind is SpanKind.CONSUMER and api.kind is SpanKind.CLIENT
    assert dict(job_span.attributes or {}) == {
        "feishu_inbox.job.id": job.id,
        "feishu_inbox.event.id": job.event_id,
        "feishu_inbox.event.type": "test.reply",
        "feishu_inbox.app": "default",
        "feishu_inbox.attempt": 1,
        "feishu_inbox.worker.id": job_span.attributes["feishu_inbox.worker.id"],  # type: ignore[index]
        "feishu_inbox.outcome": "completed",
    }
    assert (api.attributes or {})["feishu_inbox.openapi.result"] == "ok"
    assert (api.attributes or {})["http.response.status_code"] == 200
    assert (effect.attributes or {})["feishu_inbox.effect.idempotent"] is True
    # No secret in any attribute: not the app secret, not the tenant token the fake issued.
    attributes = json.dumps([dict(s.attributes or {}) for s in spans.get_finished_spans()])
    assert "s3cret" not in attributes and "t-" not in attributes


def test_each_attempt_is_a_span_a_failure_is_recorded_and_a_step_has_its_own(
    spans: InMemorySpanExporter,
) -> None:
    with trace.get_tracer("the-site").start_as_current_span("the site's request") as site:
        stored = ledger.enqueue(
            event_id="e1",
            event_type="test.steps",
            partition_key="chat:1",
            payload={"steps": ["step:think", "fail:once"]},
        )
    site_context = site.get_span_context()
    job = EventJob.objects.get(id=stored.job_id)
    flags = f"{int(site_context.trace_flags):02x}"
    assert (
        job.trace_parent == f"00-{site_context.trace_id:032x}-{site_context.span_id:016x}-{flags}"
    )
    with override_settings(FEISHU_INBOX={"MAX_ATTEMPTS": 1}):
        run_worker()
    found = by_name(spans)
    attempt = found["feishu_inbox job test.steps"]
    assert parent_of(attempt) == site_context.span_id
    assert attempt.status.status_code is StatusCode.ERROR
    assert (attempt.attributes or {})["feishu_inbox.outcome"] == "failed"
    [event] = [e for e in attempt.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "ValueError"
    step = found["feishu_inbox step think"]
    assert parent_of(step) == attempt.context.span_id
    assert step.status.status_code is StatusCode.UNSET


def test_an_async_handlers_effects_are_inside_its_jobs_span(spans: InMemorySpanExporter) -> None:
    """An async handler runs on the worker's event loop thread: its spans still nest."""
    with trace.get_tracer("the-site").start_as_current_span("enqueue"):
        ledger.enqueue(event_id="a1", event_type="test.async", partition_key="c", payload={})
    run_worker()
    found = by_name(spans)
    attempt, effect = found["feishu_inbox job test.async"], found["feishu_inbox effect (unnamed)"]
    assert parent_of(effect) == attempt.context.span_id
    assert effect.context.trace_id == attempt.context.trace_id


def test_without_a_provider_nothing_is_recorded_or_stored() -> None:
    """The API installed, no provider configured (a site that does not trace): the enqueue
    stores no context and every call is the no-op."""
    assert tracing.current_parent() == ""
    with tracing.span("feishu_inbox anything") as span:
        assert span is tracing.NOTHING
    with trace.get_tracer("x").start_as_current_span("not recorded"):
        stored = ledger.enqueue(event_id="n1", event_type="t", partition_key="p", payload={})
    assert EventJob.objects.get(id=stored.job_id).trace_parent == ""
