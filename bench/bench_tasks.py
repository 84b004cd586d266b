"""django.tasks tasks for bench/worker.py (the ledger as a tasks backend: project settings'
TASKS names feishu_inbox.tasks.LedgerBackend)."""

from __future__ import annotations

import os
import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]


@task
def noop() -> None:
    pass


@task
def latency(t0: float) -> None:
    now = time.time()  # task start
    with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
        f.write(f"{t0} {now}\n")
