"""The backfills' and exports' tables (SPEC §9i), beside ``models.py``.

``Backfill``  one declared backfill's run: its state, its cursor (the primary key of the last
              row a committed batch covered), rows done, the estimate of the total, its rate,
              the environment it was started in. A batch's writes and the cursor's move
              commit in one transaction (invariant 12); the cursor moves only from the value
              the batch read (a compare-and-set on ``batches``), so a batch never lands twice.
``Export``    one export: its query (signed), columns, format, the storage it writes to, and
              each part written so far with its rows, bytes and checksum; a manifest last.

Their rows change only through ``feishu_inbox.backfills``.
"""

from __future__ import annotations

from django.core.files.storage import Storage, storages
from django.db import models
from django.utils.module_loading import import_string


class BackfillState(models.TextChoices):
    RUNNING = "running"
    PAUSED = "paused"
    #: Every row was done: the migrations that need it may be applied.
    APPLIED = "applied"
    CANCELLED = "cancelled"
    #: Its batch function raised: the cursor stays at the last committed batch.
    FAILED = "failed"


class Backfill(models.Model):
    """A declared backfill's latest run (one row per backfill name)."""

    name = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=16, choices=BackfillState.choices)
    #: The run's number: 1 for the first start, one more for each run again.
    run = models.PositiveIntegerField(default=1)
    #: Jobs enqueued for this run (a resume enqueues one more); names each job's event id.
    segment = models.PositiveIntegerField(default=1)
    #: The primary key of the last row of the last committed batch (None: from the start).
    cursor = models.JSONField(null=True, blank=True)
    batches = models.BigIntegerField(default=0)
    rows_done = models.BigIntegerField(default=0)
    #: The rows it had to walk when it started, estimated (the planner's, on PostgreSQL).
    total_estimate = models.BigIntegerField(null=True, blank=True)
    #: Rows per second, smoothed over the last batches (0 until two batches committed).
    rate = models.FloatField(default=0.0)
    #: No batch committed for this long while running: stalled (``backfill_stalled``).
    stall_seconds = models.FloatField(default=600.0)
    #: FEISHU_INBOX["ENVIRONMENT"] of the settings that started it ("": unmarked).
    environment = models.CharField(max_length=64, blank=True, default="")
    #: A run again after it was applied (``start(force=True)``).
    forced = models.BooleanField(default=False)
    job_id = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField()
    #: When the current batch began, and when the last one committed.
    batch_started_at = models.DateTimeField(null=True, blank=True)
    last_batch_at = models.DateTimeField(null=True, blank=True)
    #: When it was last started, resumed or run again (the stall window counts from here too).
    resumed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "backfill"
        permissions = [("operate_backfill", "Can start, pause, resume and cancel backfills")]

    def __str__(self) -> str:
        return self.name


class ExportState(models.TextChoices):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class Export(models.Model):
    """One export: rows of a query, written as numbered parts and a manifest to a storage."""

    #: ``exp_…``: its name in jobs, the storage's folder, the CLI and the admin.
    uid = models.CharField(max_length=40, unique=True)
    name = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=ExportState.choices)
    #: csv or jsonl.
    format = models.CharField(max_length=8)
    columns = models.JSONField(default=list)
    #: The query, pickled and signed with the site's SECRET_KEY (read only by the worker).
    query = models.TextField()
    #: Which storage: an alias of settings.STORAGES, or a deconstructed storage
    #: ({"path": …, "args": …, "kwargs": …}).
    storage = models.JSONField(default=dict)
    #: The folder its files are written under: ``<EXPORT_PREFIX>/<name>/<uid>/``.
    prefix = models.CharField(max_length=400)
    part_rows = models.PositiveIntegerField()
    chunk_size = models.PositiveIntegerField(default=2000)
    max_part_bytes = models.BigIntegerField()
    #: What a row that cannot be written does: fail the export, or be skipped (and counted).
    on_invalid = models.CharField(max_length=8, default="fail")
    #: Each written part: {"n", "name", "rows", "bytes", "sha256", "last_key"}, in order.
    parts = models.JSONField(default=list)
    part_count = models.PositiveIntegerField(default=0)
    #: The primary key of the last row of the last written part (None: from the start).
    cursor = models.JSONField(null=True, blank=True)
    rows_done = models.BigIntegerField(default=0)
    skipped = models.BigIntegerField(default=0)
    #: The keys of the first skipped rows (at most 100).
    skipped_keys = models.JSONField(default=list, blank=True)
    total_estimate = models.BigIntegerField(null=True, blank=True)
    #: The manifest's name in the storage, once written (written last).
    manifest = models.CharField(max_length=500, blank=True, default="")
    job_id = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "export"
        permissions = [("download_export", "Can download exports")]
        indexes = [models.Index(fields=["finished_at"], name="feishu_inbox_export_finished")]

    def __str__(self) -> str:
        return f"{self.name} ({self.uid})"

    def open_storage(self) -> Storage:
        """The storage its files are in (an alias of settings.STORAGES, or a storage that
        deconstructs, as every Django and django-storages storage does)."""
        spec = self.storage or {"alias": "default"}
        if "alias" in spec:
            return storages[spec["alias"]]
        cls = import_string(spec["path"])
        return cls(*spec.get("args", ()), **spec.get("kwargs", {}))

    def file_names(self) -> list[str]:
        """Its files in the storage: the parts written, and the manifest once it is complete."""
        done = self.manifest and self.state == ExportState.COMPLETED
        return [p["name"] for p in self.parts] + ([self.manifest] if done else [])

    def stored_files(self, storage: Storage) -> list[str]:
        """Every file in its folder of ``storage``, by full name: its own, and those of writes
        that never committed (a killed or stalled worker's). Empty for a storage that cannot
        list, or a folder that is not there."""
        try:
            _, names = storage.listdir(self.prefix.rstrip("/"))
        except (NotImplementedError, FileNotFoundError):
            return []
        return [self.prefix + name for name in names]
