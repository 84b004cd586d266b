"""Mount with ``path("feishu/", include("feishu_inbox.urls"))``:

- ``feishu/events/``        the app named ``default``
- ``feishu/<app>/events/``  one URL per Feishu app (each with its own secrets in APPS)
- ``feishu/metrics/``       Prometheus metrics, for staff, METRICS_TOKEN or METRICS_ALLOW
"""

from __future__ import annotations

from django.urls import path

from .feishu.webhook import EventWebhook
from .monitoring.views import metrics

app_name = "feishu_inbox"

urlpatterns = [
    path("events/", EventWebhook.as_view(), {"app": "default"}, name="events"),
    path("metrics/", metrics, name="metrics"),
    path("<slug:app>/events/", EventWebhook.as_view(), name="app_events"),
]
