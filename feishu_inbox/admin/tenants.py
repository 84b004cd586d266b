"""Tenants' weights in the fair claim (SPEC §9j): a row per tenant whose share of the workers'
slots is not 1, edited like any Django model (``change_tenantweight``); the next claims use
it. A weight outside (0, 1000] is refused by the form and by the table's CHECK constraint."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from ..tables.tenants import TenantWeight


class TenantWeightForm(forms.ModelForm):
    weight = forms.FloatField(
        min_value=0.001,
        max_value=1000,
        help_text="Its share of the slots against other tenants with due work: 1 is equal, "
        "3 takes three times as many (from 0.001 to 1,000).",
    )

    class Meta:
        model = TenantWeight
        fields = ["tenant", "weight"]


class TenantWeightAdmin(admin.ModelAdmin):
    form = TenantWeightForm
    list_display = ["tenant", "weight"]
    search_fields = ["tenant"]
    ordering = ["tenant"]
