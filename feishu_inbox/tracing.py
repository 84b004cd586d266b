"""Traces from a delivery to the reply it caused, with the OpenTelemetry API (SPEC §9d).

With the ``traces`` extra (``opentelemetry-api``) and a tracer provider the site configured
(the SDK and an exporter, or ``opentelemetry-instrument``), the ledger's processes record:

- ``feishu_inbox receive``: an event stored by the webhook or the long connection, a child
  of the request's span (Django's instrumentation) or of the delivery's ``traceparent``
  header. The enqueue stores the caller's context on the job (``current_parent``: a W3C
  ``traceparent``, 55 characters), whoever enqueues: the webhook, a task's ``enqueue()``, a
  site's own ``ledger.enqueue`` inside its span.
- ``feishu_inbox job <type>``: one per attempt, in the worker, a child of that stored context
  and linked to it (OpenTelemetry's messaging conventions for a message processed on its
  own), so the trace joins the delivery, every attempt and what each did;
- ``feishu_inbox step <name>``, ``feishu_inbox effect <name>`` and ``feishu_inbox openapi
  <method path>``: inside the job's span (the Open API path is its template, without ids).

Attributes name the job, event, type, app, attempt and outcome (``feishu_inbox.*``); never a
payload, a token or a secret. Without the package, or with no provider configured, every
call here does nothing and costs one check (the default ``ProxyTracerProvider`` is asked
nothing more).

A leaf: this module imports nothing of the package, so every layer may trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from os import environ
from typing import Any

trace: Any = None
context_api: Any = None
_propagator: Any = None
try:
    trace = import_module("opentelemetry.trace")
    context_api = import_module("opentelemetry.context")
    _propagator = import_module(
        "opentelemetry.trace.propagation.tracecontext"
    ).TraceContextTextMapPropagator()
except ImportError:  # the traces extra is not installed: trace nothing
    trace = None

#: The providers that record nothing: the API's defaults before a site configures one.
_SILENT: tuple[type, ...] = (
    (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if trace is not None else ()
)
_KINDS = (
    {
        "internal": trace.SpanKind.INTERNAL,
        "server": trace.SpanKind.SERVER,
        "client": trace.SpanKind.CLIENT,
        "consumer": trace.SpanKind.CONSUMER,
    }
    if trace is not None
    else {}
)
#: The environment names a provider for the API to load on first use (read once: a process's
#: environment is set before it starts).
_PROVIDER_NAMED = "OTEL_PYTHON_TRACER_PROVIDER" in environ
#: The tracer of the provider it came from (a site may set its provider after import).
_tracer: tuple[Any, Any] = (None, None)


def _active_tracer() -> Any:
    """The package's tracer, or None when nothing would record a span."""
    global _tracer
    if trace is None:
        return None
    # Until a provider is set, the API reads the environment on every call (a few µs a job):
    # its global is looked at first (if a later API renames it, the call decides, as before).
    if not _PROVIDER_NAMED and getattr(trace, "_TRACER_PROVIDER", True) is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, _SILENT):
        return None
    if _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer("feishu_inbox"))
    return _tracer[1]


class Span:
    """A span this module started (or nothing, when none is recording)."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Any = None, token: Any = None) -> None:
        self._span = span
        self._token = token

    def set(self, key: str, value: str | int | bool | float) -> None:
        if self._span is not None:
            self._span.set_attribute(key, value)

    def detach(self) -> None:
        """Make its parent current again on this thread and leave it open: another thread
        ends it (a worker's batch, once the job's finish is written)."""
        if self._token is not None:
            context_api.detach(self._token)
            self._token = None

    def end(self, error: BaseException | None = None) -> None:
        """End it (``error``: what ended it, recorded with an error status), and make its
        parent current again."""
        if self._span is None:
            return
        if error is not None and isinstance(error, Exception):
            self._span.record_exception(error)
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
        if self._token is not None:
            context_api.detach(self._token)
        self._span.end()
        self._span = None


NOTHING = Span()


def _context_of(traceparent: str) -> Any:
    """The remote context a stored ``traceparent`` names (None: none, or not valid)."""
    if not traceparent:
        return None
    found = _propagator.extract({"traceparent": traceparent})
    span_context = trace.get_current_span(found).get_span_context()
    return found if span_context.is_valid else None


def start(
    name: str,
    *,
    kind: str = "internal",
    parent: str = "",
    link_parent: bool = False,
    attributes: dict[str, Any] | None = None,
) -> Span:
    """Start a span and make it current. ``parent``: a stored ``traceparent`` that becomes
    its parent (and, ``link_parent``, its link) — only when no span is current already, or
    ``link_parent`` (a job's: its own stored context comes first)."""
    tracer = _active_tracer()
    if tracer is None:
        return NOTHING
    remote = _context_of(parent)
    links: tuple[Any, ...] = ()
    if remote is not None and not link_parent and trace.get_current_span().is_recording():
        remote = None  # the current span (the request's) is the parent
    if remote is not None and link_parent:
        links = (trace.Link(trace.get_current_span(remote).get_span_context()),)
    span = tracer.start_span(
        name, context=remote, kind=_KINDS[kind], attributes=attributes, links=links
    )
    token = context_api.attach(trace.set_span_in_context(span, remote))
    return Span(span, token)


@contextmanager
def span(name: str, **options: Any) -> Iterator[Span]:
    """``start`` as a ``with`` block: the span ends with the block, and records what it
    raised."""
    started = start(name, **options)
    try:
        yield started
    except BaseException as exc:
        started.end(exc)
        raise
    started.end()


def current_parent() -> str:
    """The current span's context as a W3C ``traceparent`` ("" when nothing records one):
    what the enqueue stores on the job."""
    if _active_tracer() is None:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def annotate(**attributes: str | int | bool) -> None:
    """Set attributes on the current span (the dots of their names written as ``__``)."""
    if _active_tracer() is None:
        return
    current = trace.get_current_span()
    for key, value in attributes.items():
        current.set_attribute(key.replace("__", "."), value)


def captured() -> Any:
    """The current context, to carry into another thread or event loop (``attached``)."""
    return context_api.get_current() if _active_tracer() is not None else None


@contextmanager
def attached(carried: Any) -> Iterator[None]:
    """Run the block in a context ``captured`` elsewhere (an async handler's coroutine runs
    on the worker's event loop thread, not on the thread that started the job's span)."""
    if carried is None:
        yield
        return
    token = context_api.attach(carried)
    try:
        yield
    finally:
        context_api.detach(token)
