"""Tenants' rows of the ledger (SPEC §9j): their weights in the fair claim, and a store (ISV)
app's credentials, shared by every worker through the ledger.

A tenant's weight (``TenantWeight``; 1 without a row) is its share of the workers' slots
while several tenants have due work: the claim gives the next slot to the tenant with the
fewest running jobs per weight (``store/functions/0039_fair_claims.sql``).

A store app's credentials:

One row per (app, kind, tenant): the app's newest ``app_ticket`` (kind ``ticket``, which
Feishu pushes about every hour), its ``app_access_token`` (``app``) and each tenant's
``tenant_access_token`` (``tenant``). ``fetching_by`` / ``fetching_until`` is the lease of the
one worker fetching the row's value anew (the others wait for it), so each token is fetched
once per expiry however many processes need it (``ledger/credentials.py``); on the ticket's
row it is the lease of the one resend request. The values are secrets: no admin page shows
this table and no log line prints them.
"""

from __future__ import annotations

from django.db import models


class AppCredential(models.Model):
    TICKET, APP_TOKEN, TENANT_TOKEN = "ticket", "app", "tenant"

    app = models.CharField(max_length=64)
    kind = models.CharField(max_length=8)
    #: The tenant's key (``tenant`` rows), else "".
    tenant = models.CharField(max_length=64, blank=True, default="")
    value = models.TextField(blank=True, default="")
    #: When the token expires (Feishu's ``expire`` after its fetch); a ticket's is None.
    expires_at = models.DateTimeField(null=True, blank=True)
    #: A ticket's ``ts`` (seconds, Feishu's): an older one delivered late never replaces it.
    issued_at = models.FloatField(null=True, blank=True)
    fetching_by = models.CharField(max_length=32, blank=True, default="")
    fetching_until = models.DateTimeField(null=True, blank=True)
    #: How many times the value was fetched (or a ticket stored, or a resend asked for).
    fetches = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = "store app credential"
        constraints = [
            models.UniqueConstraint(
                fields=["app", "kind", "tenant"], name="feishu_inbox_credential_once"
            )
        ]

    def __str__(self) -> str:  # never the value
        return f"{self.app} {self.kind} {self.tenant}".strip()


class TenantWeight(models.Model):
    """A tenant's share of the workers while several tenants have due work (1: an equal one)."""

    tenant = models.CharField(max_length=64, primary_key=True)
    weight = models.FloatField(
        default=1.0,
        help_text="Its share of the slots against other tenants with due work (1 is equal; "
        "2 takes twice as many).",
    )

    class Meta:
        verbose_name = "tenant weight"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(weight__gt=0) & models.Q(weight__lte=1000),
                name="feishu_inbox_tenant_weight_range",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant or '(none)'}: {self.weight:g}"
