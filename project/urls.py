from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("feishu/", include("feishu_inbox.urls")),
    path("bench/noop/", views.noop),
]
