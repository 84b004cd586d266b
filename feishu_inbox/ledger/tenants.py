"""Tenants (SPEC §9j): whose each job is.

Every job has a tenant: Feishu's ``header.tenant_key`` for an event, the ``tenant=`` its
enqueuer declared for other work, or "" for none. A caller declares it per call
(``ledger.enqueue(tenant=...)``, ``publish(..., tenant=...)``, a schedule's or a workflow
spec's ``tenant``), or for every job enqueued inside a block::

    with feishu_inbox.tenant("acme"):
        send_invoice.enqueue(order.pk)        # a django.tasks task: tenant "acme"

A handler's block is its own job's tenant (the worker opens it around the handler), so the
tasks, children, batches and webhook messages a handler enqueues are its tenant's unless it
says otherwise. With ``TENANT_REQUIRED`` a job that declared nothing (no ``tenant=``, no
block) is refused with ``job_tenant_required``; ``tenant=""`` declares "no tenant" explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..conf import checked_settings
from ..errors import LedgerError, TenantRequired

#: The column's length (models.EventJob.tenant).
TENANT_LIMIT = 64

_current: ContextVar[str | None] = ContextVar("feishu_inbox_tenant", default=None)
#: The running job's tenant, if the caller runs inside a handler: the runtime hands it in
#: (``runtime/context.py``), this layer never imports it.
_running_job_tenant: list[Callable[[], str | None]] = [lambda: None]


def read_running_job_tenant(source: Callable[[], str | None]) -> None:
    """Called by the runtime once: how to read the running handler's job's tenant."""
    _running_job_tenant[0] = source


def current() -> str | None:
    """The tenant of the innermost ``tenant`` block around the caller, else the running
    handler's job's, else None (undeclared)."""
    found = _current.get()
    return _running_job_tenant[0]() if found is None else found


def check(tenant: object) -> str:
    """``tenant`` if it can be stored, else ``LedgerError`` saying why."""
    if not isinstance(tenant, str) or len(tenant) > TENANT_LIMIT:
        raise LedgerError(
            f"A tenant is a string of at most {TENANT_LIMIT} characters (got {tenant!r:.80}).",
            fix="Pass the tenant's key (Feishu's tenant_key, or your own), or '' for none.",
        )
    return tenant


@contextmanager
def tenant(key: str) -> Iterator[None]:
    """Jobs enqueued inside this block that name no tenant of their own are ``key``'s ("":
    explicitly no tenant)."""
    token = _current.set(check(key))
    try:
        yield
    finally:
        _current.reset(token)


def resolve(tenant: str | None, *, what: str = "A job") -> str:
    """The tenant a job is stored with: its own, else the block's; ``TenantRequired`` when
    neither declares one and the site requires it, else "" (none)."""
    if tenant is None:
        tenant = current()
    if tenant is None:
        if checked_settings().TENANT_REQUIRED:
            raise TenantRequired(
                f"{what} declared no tenant, and TENANT_REQUIRED is on; nothing was stored."
            )
        return ""
    return check(tenant)
