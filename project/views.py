"""Demo-project views that are not part of the app."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST


@csrf_exempt
@require_POST
def noop(request: HttpRequest) -> JsonResponse:
    """Reads the body and answers: what the same server costs without the webhook's work.

    bench/ingest.py measures the webhook beside it.
    """
    request.read()
    return JsonResponse({"ok": True})
