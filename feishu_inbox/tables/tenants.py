"""A store (ISV) app's credentials, shared by every worker through the ledger (SPEC §9j).

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
