"""What operators' monitoring reads (SPEC §9d): the ledger's gauges for Prometheus, served by
``runworker --metrics-port`` and by a view a site mounts behind its own protection.

- ``ledger_metrics``: the ledger's state, read from the database when scraped, with bounded
  cost (indexed queries only; completed rows are never counted) and cached a few seconds, so
  ten Prometheus servers scraping every worker cost one read per few seconds per process;
- ``serve``: ``/metrics`` (the process's counters and the ledger's gauges) and ``/healthz`` on
  a port of the worker's;
- ``backfills``: each backfill's progress and stall, and the exports running;
- ``database``: the server's side, read with those gauges: dead tuples in the ledger's
  tables, the oldest snapshot holding vacuum back, the replication a commit gets;
- ``views``: ``views.metrics``, the same for the web process, behind staff login, a bearer
  token (``METRICS_TOKEN``) or an address allow-list (``METRICS_ALLOW``).

The counters themselves are in ``telemetry.py`` (a leaf every layer counts with); the alert
rules and the dashboard that ship with the package are in ``prometheus/alerts.yml`` and
``grafana/feishu_inbox.json``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection

from .. import telemetry

log = logging.getLogger("feishu_inbox.monitoring")

#: Seconds a reading of the ledger is served again before it is read anew.
CACHE_SECONDS = 5.0


class LedgerCollector:
    """A Prometheus collector of the ledger's state (one per process, in the default
    registry). A scrape that finds the database away yields ``feishu_inbox_ledger_up 0`` and
    the process's own counters, never an error page."""

    def __init__(self, cache_seconds: float = CACHE_SECONDS) -> None:
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._read_at = -1e9
        self._families: list[Any] = []

    def describe(self) -> list[Any]:
        return []  # read at scrape time only (no query when the collector is registered)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.cache_seconds:
                self._families = self._read()
                self._read_at = time.monotonic()
            yield from self._families

    def _read(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        started = time.monotonic()
        up = GaugeMetricFamily(
            "feishu_inbox_ledger_up", "Whether the last reading of the ledger succeeded."
        )
        try:
            families = _ledger_families()
        except DatabaseError as exc:
            log.warning("metrics: the ledger could not be read (%s)", exc)
            connection.close()
            up.add_metric([], 0)
            return [up]
        finally:
            if connection.in_atomic_block is False:
                connection.close_if_unusable_or_obsolete()
        up.add_metric([], 1)
        took = GaugeMetricFamily(
            "feishu_inbox_ledger_read_seconds", "How long the last reading of the ledger took."
        )
        took.add_metric([], time.monotonic() - started)
        return [up, took, *families]


def _ledger_families() -> list[Any]:
    from prometheus_client.core import GaugeMetricFamily

    from ..ledger import stats as ledger_stats
    from ..ledger import trees as workflows
    from ..ledger import workers as worker_beats
    from ..models import BLOCKING, EventJob, Partition, Schedule, Status
    from ..schedules import declared

    found = ledger_stats.stats(count_completed=False)
    now = ledger_stats.database_now()
    jobs = GaugeMetricFamily(
        "feishu_inbox_ledger_jobs",
        "Unresolved jobs per state (completed jobs are not counted: see "
        "feishu_inbox_jobs_finished_total).",
        labels=["state"],
    )
    unresolved = (Status.QUEUED, Status.RUNNING, Status.RETRY_WAIT, Status.WAITING)
    for state in (*unresolved, Status.FAILED, Status.UNKNOWN):
        jobs.add_metric([state.value], found.counts.get(state.value, 0))
    families = [jobs]
    for name, doc, value in (
        ("feishu_inbox_ledger_due_jobs", "Queued and retry-wait jobs due now.", found.due),
        ("feishu_inbox_ledger_delayed_jobs", "Retry-wait jobs not due yet.", found.delayed),
        (
            "feishu_inbox_ledger_due_behind_head_jobs",
            "Due jobs waiting behind an earlier job of their chat.",
            found.due_behind_head,
        ),
        (
            "feishu_inbox_ledger_oldest_due_seconds",
            "How long the oldest claimable job has been due (0: none is).",
            found.oldest_due_age_seconds or 0.0,
        ),
        (
            "feishu_inbox_ledger_blocked_partitions",
            "Chats (partitions) whose head is failed or unknown: nothing after it runs.",
            found.blocked_partitions,
        ),
        (
            "feishu_inbox_ledger_running_partitions",
            "Chats (partitions) whose head is running.",
            found.running_partitions,
        ),
    ):
        gauge = GaugeMetricFamily(name, doc)
        gauge.add_metric([], value)
        families.append(gauge)
    oldest_blocked = (
        EventJob.objects.filter(
            pk__in=Partition.objects.filter(head_state__in=BLOCKING).values("head_id")
        )
        .order_by("finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )
    blocked_age = GaugeMetricFamily(
        "feishu_inbox_ledger_oldest_blocked_seconds",
        "How long the oldest blocked chat's head has been failed or unknown (0: none is).",
    )
    blocked_age.add_metric([], _age(now, oldest_blocked))
    families.append(blocked_age)
    open_batches = GaugeMetricFamily(
        "feishu_inbox_ledger_open_batches",
        "Workflows' batches not fired yet (SPEC §9f), by kind (batch, children, chain) and "
        "state (open: taking members; closed: waiting for them to end; stopped: a chain held "
        "at a failed link).",
        labels=["kind", "state"],
    )
    for (kind, batch_state), n in sorted(workflows.open_batches_by_kind().items()):
        open_batches.add_metric([kind, batch_state], n)
    families.append(open_batches)
    running = GaugeMetricFamily(
        "feishu_inbox_ledger_running_jobs",
        "Running jobs per worker (by the ledger: a dead worker's show until their leases expire).",
        labels=["worker"],
    )
    beats = worker_beats.workers()
    per_worker = dict(_running_per_worker())
    for w in beats:  # a live worker with nothing running reads 0, not nothing
        if w.state == "live":
            per_worker.setdefault(w.worker_id, 0)
    for worker, n in sorted(per_worker.items()):
        running.add_metric([worker], n)
    families.append(running)
    states = GaugeMetricFamily(
        "feishu_inbox_workers",
        "Workers by the state of their heartbeat rows: live, lost (no beat for three "
        "intervals) or stopped.",
        labels=["state"],
    )
    for name in ("live", "lost", "stopped"):
        states.add_metric([name], sum(1 for w in beats if w.state == name))
    families.append(states)
    specs = declared()
    if specs:
        last = GaugeMetricFamily(
            "feishu_inbox_schedule_last_fired_timestamp_seconds",
            "When each schedule last enqueued a job (Unix time; 0: never).",
            labels=["schedule"],
        )
        upcoming = GaugeMetricFamily(
            "feishu_inbox_schedule_next_timestamp_seconds",
            "Each schedule's next occurrence after its watermark (Unix time; 0: none).",
            labels=["schedule"],
        )
        rows = {r.name: r for r in Schedule.objects.filter(name__in=list(specs))}
        for name, spec in sorted(specs.items()):
            row = rows.get(name)
            fired = row.last_fired_at if row else None
            last.add_metric([name], fired.timestamp() if fired else 0.0)
            following = spec.cron.after(row.watermark) if row else None
            upcoming.add_metric([name], following.timestamp() if following else 0.0)
        families += [last, upcoming]
    families.append(_tenant_family())
    from .backfills import backfill_families
    from .database import database_families

    return families + backfill_families() + database_families()


def _tenant_family() -> Any:
    """Jobs per tenant (SPEC §9j), bounded: the TENANT_METRICS_TOP tenants with the largest
    backlog, the rest summed as tenant "other" (jobs of no tenant: "none")."""
    from prometheus_client.core import GaugeMetricFamily

    from ..conf import inbox_settings
    from ..ledger import stats as ledger_stats

    family = GaugeMetricFamily(
        "feishu_inbox_ledger_tenant_jobs",
        "Queued and retry-wait (backlog) and running jobs of the tenants with the largest "
        'backlog; the other tenants summed as tenant "other", jobs of no tenant as "none".',
        labels=["tenant", "state"],
    )
    for load in ledger_stats.tenant_load(inbox_settings().TENANT_METRICS_TOP):
        family.add_metric([load.tenant, "backlog"], load.backlog)
        family.add_metric([load.tenant, "running"], load.running)
    return family


def _running_per_worker() -> list[tuple[str, int]]:
    from django.db.models import Count

    from ..models import EventJob

    rows = EventJob.objects.running().values("worker_id").annotate(n=Count("id"))
    return [(r["worker_id"], int(r["n"])) for r in rows.order_by("worker_id")]


def _age(now: datetime, since: datetime | None) -> float:
    return 0.0 if since is None else max(0.0, (now - since).total_seconds())


_collector: list[LedgerCollector] = []
_collector_lock = threading.Lock()


def ledger_metrics() -> LedgerCollector:
    """The process's ledger collector, registered in the default registry once."""
    from prometheus_client import REGISTRY

    with _collector_lock:
        if not _collector:
            found = LedgerCollector()
            REGISTRY.register(found)
            _collector.append(found)
        return _collector[0]


def exposition() -> tuple[bytes, str]:
    """The process's metrics and the ledger's, in Prometheus's text format (or, with gunicorn's
    multiprocess mode, every worker process's counters and this process's ledger reading):
    (body, content type)."""
    import os

    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    collector = ledger_metrics()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(collector)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def available() -> bool:
    return telemetry.ENABLED


class _Server:
    """``/metrics`` and ``/healthz`` on a port of the process (a thread of its own)."""

    def __init__(self, host: str, port: int, health: Any) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.health = health
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # Prometheus scrapes every few seconds: not a log line each time

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    try:
                        body, content_type = exposition()
                        status = 200
                    except Exception as exc:  # never a broken connection for a scraper
                        log.exception("metrics: the exposition failed")
                        body, content_type = f"exposition failed: {exc}\n".encode(), "text/plain"
                        status = 500
                elif path == "/healthz":
                    ok, text = server.health()
                    status, content_type = (200 if ok else 503), "text/plain; charset=utf-8"
                    body = (text + "\n").encode()
                else:
                    status, content_type = 404, "text/plain; charset=utf-8"
                    body = b"not found: /metrics and /healthz are served here\n"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="feishu-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> _Server:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def serve(host: str, port: int, health: Any) -> _Server:
    """Serve ``/metrics`` and ``/healthz`` (``health() -> (ok, text)``) on ``host:port`` (0: a
    free port) from a thread; ``OSError`` when the port is taken."""
    ledger_metrics()
    return _Server(host, port, health).start()
