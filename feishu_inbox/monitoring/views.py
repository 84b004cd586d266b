"""``metrics/``: the web process's counters and the ledger's gauges, for Prometheus, behind
the site's protection: a logged-in staff user, ``Authorization: Bearer <METRICS_TOKEN>``, or a
client address in ``METRICS_ALLOW``. Anyone else gets 401 (and nothing is read).

    scrape_configs:
      - job_name: feishu_inbox_web
        metrics_path: /feishu/metrics/
        authorization: {credentials: "<METRICS_TOKEN>"}

With gunicorn's several worker processes, set ``PROMETHEUS_MULTIPROC_DIR`` (an empty directory
per start) in their environment: each scrape then adds up every process's counters.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from ..conf import checked_settings
from . import available, exposition

log = logging.getLogger("feishu_inbox.monitoring")


def allowed(request: HttpRequest) -> bool:
    """Staff, the bearer token (compared in constant time), or an allowed network."""
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    conf = checked_settings()
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if conf.METRICS_TOKEN and header.startswith("Bearer "):
        given = header.removeprefix("Bearer ").strip()
        if hmac.compare_digest(given.encode(), conf.METRICS_TOKEN.encode()):
            return True
    if conf.METRICS_ALLOW:
        try:
            address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
        except ValueError:
            return False
        return any(address in ipaddress.ip_network(n, strict=False) for n in conf.METRICS_ALLOW)
    return False


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        log.warning("refused a metrics scrape from %s", request.META.get("REMOTE_ADDR"))
        response = HttpResponse(
            "Metrics need a staff login, Authorization: Bearer <METRICS_TOKEN>, or an address "
            "in METRICS_ALLOW.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="feishu_inbox metrics"'
        return response
    if not available():
        return HttpResponse(
            "Metrics need prometheus-client: pip install prometheus-client (the metrics extra).\n",
            status=501,
            content_type="text/plain; charset=utf-8",
        )
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)
