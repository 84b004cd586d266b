from __future__ import annotations

from django.db import models


class Item(models.Model):
    #: Added nullable by 0001, filled by the backfill ``gate.fill_value``, NOT NULL from 0002.
    value = models.IntegerField()

    def __str__(self) -> str:
        return f"item {self.pk}"
