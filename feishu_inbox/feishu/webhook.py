"""The webhook: ``protocol.open_delivery`` → ``inbound.store`` (one transaction) → 200.

The view only maps outcomes to HTTP; the protocol steps are in ``protocol.py``. Nothing else runs.

Refusals answer a short JSON error (``{"error": code, "message": …}``), log the reason (never
secrets or the body) and store nothing. A database that is down or locked past its timeout
answers 503, so Feishu redelivers; 2xx is sent only after the commit.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from .. import telemetry
from ..conf import InboxSettings, checked_settings
from . import inbound, protocol
from .inbound import database_failure, unstorable
from .protocol import ProtocolError

log = logging.getLogger("feishu_inbox.webhook")


def _error(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": code, "message": message}, status=status)


@method_decorator(csrf_exempt, name="dispatch")  # authenticated by signature and token
class EventWebhook(View):
    http_method_names = ["post"]

    def http_method_not_allowed(
        self, request: HttpRequest, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        response = _error("method_not_allowed", "Feishu delivers events with POST.", 405)
        response["Allow"] = "POST"
        return response

    def post(self, request: HttpRequest, app: str = "default") -> HttpResponse:
        started = time.perf_counter()
        conf = checked_settings()
        secrets = conf.APPS.get(app)
        if secrets is None:
            log.warning("refused delivery for unknown app %r", app)
            telemetry.DELIVERIES.labels("", "webhook", "unknown_app").inc()  # not its name
            return _error("unknown_app", f"No Feishu app {app!r} is configured here.", 404)
        try:
            body = self._read_body(request, conf)
            response = self._handle(request, body, app, secrets, conf)
        except ProtocolError as exc:
            log.warning(
                "refused delivery (app %s, %s): %s",
                app,
                exc.code,
                exc.message,
                extra={"remote_addr": request.META.get("REMOTE_ADDR")},
            )
            telemetry.DELIVERIES.labels(app, "webhook", exc.code).inc()
            return _error(exc.code, exc.message, exc.status)
        except DataError as exc:
            # The database refuses this payload (e.g. a \u0000 escape in jsonb): redelivery
            # would fail forever, so it is bad input, not an outage.
            # its first line only: the others quote the payload
            log.warning(
                "refused delivery (app %s, unstorable_payload): %s",
                app,
                str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
            )
            telemetry.DELIVERIES.labels(app, "webhook", "unstorable_payload").inc()
            return _error("unstorable_payload", "The event cannot be stored as JSON.", 400)
        except IntegrityError as exc:
            # Not an outage: a row check refused a value, or a bug (inbound.store answers a
            # duplicate lost to a race as a duplicate). Redelivery would fail the same way.
            log.exception("refused delivery (app %s, unstorable_payload): integrity error", app)
            telemetry.DELIVERIES.labels(app, "webhook", "unstorable_payload").inc()
            return _error("unstorable_payload", unstorable(exc), 400)
        except DatabaseError as exc:
            cause, words = database_failure(exc)
            log.error(
                "database unavailable (%s), asking Feishu to redeliver: %s: %s",
                cause,
                type(exc).__name__,
                words,
            )
            telemetry.DELIVERIES.labels(app, "webhook", "database_unavailable").inc()
            telemetry.DATABASE_OUTAGES.labels(app, "webhook", cause).inc()
            response = _error(
                "database_unavailable", "The event could not be stored; retry later.", 503
            )
            response["Retry-After"] = "5"
            return response
        log.debug("answered in %.1f ms", (time.perf_counter() - started) * 1000)
        return response

    def _read_body(self, request: HttpRequest, conf: InboxSettings) -> bytes:
        limit = conf.MAX_BODY_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise ProtocolError("too_large", f"The body is over {limit} bytes.", status=413)
        stream: Any = request
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            # No Content-Length: Django's request stream would read nothing. A server that
            # de-chunks the body and ends the stream says so (gunicorn does); read it directly.
            if not request.META.get("wsgi.input_terminated"):
                raise ProtocolError(
                    "length_required",
                    "A chunked body needs a server that de-chunks it (wsgi.input_terminated, "
                    "e.g. gunicorn); send a Content-Length instead.",
                    status=411,
                )
            stream = request.META["wsgi.input"]
        body = stream.read(limit + 1)
        if len(body) > limit:
            raise ProtocolError("too_large", f"The body is over {limit} bytes.", status=413)
        return body

    def _handle(
        self,
        request: HttpRequest,
        body: bytes,
        app: str,
        secrets: dict[str, str],
        conf: InboxSettings,
    ) -> HttpResponse:
        delivery = protocol.open_delivery(
            app=app,
            secrets=secrets,
            body=body,
            headers=request.META,
            replay_window=conf.REPLAY_WINDOW_SECONDS,
            now=time.time(),
        )
        envelope = delivery.envelope
        if envelope is None:
            log.info("answered URL verification for app %s", app)
            telemetry.DELIVERIES.labels(app, "webhook", "challenge").inc()
            return JsonResponse({"challenge": delivery.challenge})
        if envelope.event_type == protocol.CARD_ACTION:
            telemetry.DELIVERIES.labels(app, "webhook", "card_action").inc()
            return self._card_action(app, envelope, conf)

        result = inbound.store(app, envelope, traceparent=request.headers.get("traceparent", ""))
        return JsonResponse({"ok": True, "duplicate": not result.created})

    def _card_action(
        self, app: str, envelope: protocol.Envelope, conf: InboxSettings
    ) -> HttpResponse:
        return JsonResponse(inbound.answer_card(app, envelope, conf.CARD_CALLBACK_BUDGET_SECONDS))
