from __future__ import annotations

from django.contrib import admin

from .models import Reply


@admin.register(Reply)
class ReplyAdmin(admin.ModelAdmin):
    list_display = ["id", "chat", "text", "job_id", "sent_at"]
