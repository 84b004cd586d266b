"""The app's backfill (autodiscovered, as a site's ``feishu_handlers`` module is)."""

from __future__ import annotations

from typing import Any

from django.db.models import F

import feishu_inbox

from .models import Item


@feishu_inbox.backfill(
    "gate.fill_value",
    Item.objects.filter(value=None),
    batch_size=7,
    after="backfill_app.0001_initial",
    before="backfill_app.0002_value_not_null",
)
def fill_value(batch: Any) -> None:
    batch.update(value=F("id") + 1000)
