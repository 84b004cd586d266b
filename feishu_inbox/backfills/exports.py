"""Exports (SPEC §9i): a queryset's rows streamed into numbered parts and a manifest.

    with transaction.atomic():
        handle = feishu_inbox.export(
            "orders-2026",
            Order.objects.filter(created_at__year=2026),
            columns=["id", "customer__name", "total", "created_at"],
            format="csv",             # or "jsonl"
            part_rows=100_000,
            storage="exports",        # an alias of settings.STORAGES, a Storage, or None
        )

The export is a job (in the caller's transaction: no commit, no export). Its worker reads the
rows by primary key after a cursor (``chunk_size`` rows in memory at a time: through a
server-side cursor, or by key where the connection keeps none), one part at a time: part n
holds the ``part_rows`` rows after part n-1's last key (and every other row of its own last
key: a to-many column repeats a key, and a key is never split between parts), written to a
temporary file and saved under a name of this write's own (``part-00001-<tag>.csv``); the
part, its name and the cursor are then recorded in one commit that expects part n-1 to be the
last (compare and set). A worker killed mid-part leaves the cursor where it was, and the next
attempt writes that part again under a new name. A stalled worker that lost its lease (a
zombie) can finish writing a file, never replace one: its commit matches nothing, and it
deletes what it wrote. No transaction is open while a file is written.

The manifest (``manifest.json``) is written last, from a state no attempt can change any more:
the commit that records its name also closes the parts (``manifest`` set: no part's compare
and set matches), the files of attempts that never committed are deleted, the manifest is
written (an attempt that finds it already there, as written, leaves it), and the export is
completed. A row that cannot be written fails the export (``export_row_invalid``, with its
key) or, with ``on_invalid="skip"``, is counted and its key kept; a part bigger than
``max_part_bytes`` fails it (``export_part_too_large``).
"""

from __future__ import annotations

import base64
import logging
import pickle
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.core import signing
from django.core.exceptions import FieldError
from django.core.files.storage import InvalidStorageError
from django.db import NotSupportedError, connections, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from .. import telemetry
from ..conf import checked_settings
from ..errors import Cancelled, Concluded, LedgerError
from ..ledger import rules as ledger
from ..ledger.kinds import JobKind
from ..runtime import context
from ..runtime.handlers import safe_point
from ..tables.backfills import Export, ExportState
from . import parts
from .control import estimate_rows
from .refusals import ExportError, ExportPartTooLarge, ExportRowInvalid

log = logging.getLogger("feishu_inbox.exports")

APP = "exports"
PREFIX = "export:"
ATTEMPTS = 1_000_000
FORMATS = ("csv", "jsonl")
QUERY_SALT = "feishu_inbox.exports.query"
#: How a sealed query starts when it carries its database's alias.
SEALED = "q2"
#: The largest part_rows and chunk_size (their columns' range).
MAX_ROWS = 2**31 - 1
#: An export's name: a folder of its storage, so no '/', and no '..' to climb out of it.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
#: Rows encoded together (a block with an invalid row is encoded again row by row).
BLOCK_ROWS = 1000
#: Skipped rows whose keys are kept on the export.
KEPT_KEYS = 100


@dataclass(frozen=True)
class ExportHandle:
    """An export enqueued: its id (``exp_…``), its job, and the folder it writes to."""

    uid: str
    job_id: int
    prefix: str


def seal(queryset: QuerySet[Any]) -> str:
    """The query, pickled and signed, with the database the caller chose (``using()``; none:
    the routers choose again, as for the caller): the alias is the queryset's, not its
    query's, and a worker that lost it would read another database."""
    raw = base64.b64encode(pickle.dumps(queryset.query)).decode()
    alias = getattr(queryset, "_db", None) or ""  # using(): its own, not its query's
    return signing.Signer(salt=QUERY_SALT).sign(f"{SEALED}:{raw}:{alias}")


def unseal(export: Export) -> QuerySet[Any]:
    value = signing.Signer(salt=QUERY_SALT).unsign(export.query)
    alias = ""
    if value.startswith(f"{SEALED}:"):  # (base64 has no ':'); before it: the query alone
        _, value, alias = value.split(":", 2)
    query = pickle.loads(base64.b64decode(value))  # noqa: S301  (signed by this site)
    queryset = query.model._default_manager.all()
    queryset.query = query
    return queryset.using(alias) if alias else queryset


def export(
    name: str,
    queryset: QuerySet[Any],
    *,
    columns: list[str] | tuple[str, ...],
    format: str = "csv",
    part_rows: int = 100_000,
    storage: Any = None,
    on_invalid: str = "fail",
    chunk_size: int = 2000,
    max_part_bytes: int | None = None,
) -> ExportHandle:
    """Enqueue an export of ``queryset``'s rows (see the module); returns its handle."""
    problems = []
    if not isinstance(name, str) or not NAME.fullmatch(name):
        problems.append(
            "name must be 1 to 200 letters, digits, '.', '-' or '_', starting with a letter "
            f"or digit: it names a folder of the storage (got {name!r:.80})"
        )
    if not isinstance(queryset, QuerySet):
        problems.append(f"queryset must be a QuerySet (got {type(queryset).__name__})")
    if not columns or not all(isinstance(c, str) and c for c in columns):
        problems.append("columns must be a list of field names (lookups like 'customer__name')")
    if format not in FORMATS:
        problems.append(f"format must be csv or jsonl (got {format!r})")
    for what, value, most in (
        ("part_rows", part_rows, MAX_ROWS),
        ("chunk_size", chunk_size, MAX_ROWS),
        ("max_part_bytes", 1 if max_part_bytes is None else max_part_bytes, 2**63 - 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            problems.append(f"{what} must be a whole number from 1 to {most} (got {value!r})")
    if on_invalid not in ("fail", "skip"):
        problems.append(f"on_invalid must be 'fail' or 'skip' (got {on_invalid!r})")
    if isinstance(queryset, QuerySet):
        problems += unreadable_by_key(queryset)
    try:
        where = parts.storage_spec(storage)
    except (ValueError, InvalidStorageError, AttributeError, TypeError) as exc:
        problems.append(f"storage: {exc}")
    if problems:
        raise LedgerError("export was refused: " + "; ".join(problems) + ".")
    try:  # the worker's own query: in key order, after a key
        rows = queryset.order_by("pk").filter(pk__gt=F("pk")).values_list("pk", *columns)
        rows.query.get_compiler(queryset.db).as_sql()
    except Exception as exc:
        raise LedgerError(
            f"export was refused: its columns do not fit the query ({exc})."
        ) from None
    conf = checked_settings()
    uid = f"exp_{secrets.token_hex(8)}"
    prefix = f"{conf.EXPORT_PREFIX.strip('/')}/{name}/{uid}/"
    with transaction.atomic():
        row = Export.objects.create(
            uid=uid,
            name=name,
            state=ExportState.RUNNING,
            format=format,
            columns=list(columns),
            query=seal(queryset),
            storage=where,
            prefix=prefix,
            part_rows=part_rows,
            chunk_size=chunk_size,
            max_part_bytes=(
                conf.EXPORT_MAX_PART_BYTES if max_part_bytes is None else max_part_bytes
            ),
            on_invalid=on_invalid,
            created_at=timezone.now(),
        )
        job_id = ledger.enqueue(
            event_id=f"{PREFIX}{uid}",
            event_type=f"{PREFIX}{name}",
            partition_key=f"{PREFIX}{uid}",
            payload={"export": uid},
            app=APP,
            max_attempts=ATTEMPTS,
        ).job_id
        Export.objects.filter(pk=row.pk).update(job_id=job_id)
    return ExportHandle(uid, job_id, prefix)


def unreadable_by_key(queryset: QuerySet[Any]) -> list[str]:
    """Why the worker could not read ``queryset`` in key order after a key, part after part
    (each would fail every attempt): the problems to refuse it with."""
    query, found = queryset.query, []
    if query.is_sliced:
        found.append("queryset must not be sliced (the export reads all its rows, part by part)")
    if query.combinator:
        found.append(
            f"queryset must not be a {query.combinator}() (the export filters it by key: "
            "export each part of it, or filter one queryset with Q objects)"
        )
    if query.distinct_fields:
        found.append("queryset must not use distinct(fields) (the export orders it by key)")
    if getattr(queryset.model._meta, "is_composite_pk", False):
        found.append("queryset's model must have a single-column primary key (its cursor)")
    return found


def run(event: context.Event) -> None:
    """Write the job's export, part after part, then its manifest (see the module)."""
    uid = event.payload["export"]
    row = Export.objects.filter(uid=uid).first()
    if row is None or row.state != ExportState.RUNNING:
        return
    ctx = context.current()
    try:
        queryset = unseal(row)
    except Exception as exc:  # signed by another SECRET_KEY, or models changed under it
        why = f"Export {uid}: its query cannot be read back ({type(exc).__name__}: {exc})."
        Export.objects.filter(pk=row.pk, state=ExportState.RUNNING).update(
            state=ExportState.FAILED, error=why, finished_at=timezone.now()
        )
        raise Concluded("ExportQueryUnreadable", why) from exc
    if row.total_estimate is None and row.part_count == 0:  # the admin's "rows of …"
        Export.objects.filter(pk=row.pk).update(total_estimate=estimate_rows(queryset))
    storage = row.open_storage()
    try:
        while not row.manifest:  # set: the parts are closed (a killed finish, to end)
            safe_point()  # a lost lease, or an operator's cancel
            fetched, upto = write_part(row, queryset, storage)
            if upto is not None and fetched < row.part_rows:  # the rows ran out after it
                ctx.ensure_alive()
                close_parts(row, upto)  # unless another attempt moved on meanwhile
            row.refresh_from_db()
            if row.state != ExportState.RUNNING:
                return
        finish(row, storage)
    except ExportError as exc:
        _fail(row, exc.described())
        raise Concluded(type(exc).__name__, exc.described()) from exc
    except Cancelled:
        _fail(row, f"Export {uid}: cancelled by an operator.")
        raise
    except (TypeError, ValueError, FieldError, NotSupportedError) as exc:
        # The query cannot be read as the export reads it (a model changed under it): no
        # attempt would go further.
        why = f"Export {uid}: its rows cannot be read ({type(exc).__name__}: {exc})."
        _fail(row, why)
        raise Concluded("ExportQueryUnreadable", why) from exc


def _fail(row: Export, why: str) -> None:
    Export.objects.filter(pk=row.pk, state=ExportState.RUNNING).update(
        state=ExportState.FAILED, error=why, finished_at=timezone.now()
    )


def write_part(row: Export, queryset: QuerySet[Any], storage: Any) -> tuple[int, int | None]:
    """Write part ``part_count + 1``: the rows it read (fewer than ``part_rows``: the last
    part), and the parts that the read found written (this one when its commit landed; None:
    another attempt's landed first). A part of no rows is written only when the export has
    none at all. The rows
    of the part's last key all go in it: when the part is full, the rows of that key past
    ``part_rows`` (a to-many column) are read too, never left to a next part that starts
    after the key."""
    n = row.part_count + 1
    rows = queryset.order_by("pk")
    if row.cursor is not None:
        rows = rows.filter(pk__gt=queryset.model._meta.pk.to_python(row.cursor))
    encoder = parts.Encoder(row.format, row.columns)
    fetched = written = size = 0
    skipped: list[Any] = []
    block: list[tuple[Any, list[Any]]] = []
    #: The rows of the last key read, held back from ``block`` until a key after it comes.
    run: list[tuple[Any, list[Any]]] = []
    with parts.spooled() as content:
        size += content.write(encoder.header())

        def flush() -> None:
            nonlocal size, written
            data, kept = _encode_block(row, encoder, block, skipped)
            size += content.write(data)
            written += kept
            if size > row.max_part_bytes:
                raise ExportPartTooLarge(
                    f"Export {row.uid}: part {n} passed {row.max_part_bytes} bytes by row "
                    f"{block[-1][0] if block else None!r} ({written} rows)."
                )
            block.clear()

        values = rows.values_list("pk", *row.columns)
        for key, *rest in first_rows(values, row.part_rows, row.chunk_size):
            fetched += 1
            if run and key != run[0][0]:
                block.extend(run)
                run.clear()
                if len(block) >= BLOCK_ROWS:
                    flush()
            run.append((key, rest))
        if run and fetched == row.part_rows:  # full: its last key may have rows past it
            last = values.filter(pk=run[0][0])
            if last.count() > len(run):
                run = [(key, rest) for key, *rest in last]
        last_key = run[0][0] if run else None
        block.extend(run)
        flush()
        if fetched == 0 and n > 1:
            return 0, row.part_count
        name = parts.part_name(row.prefix, n, row.format, secrets.token_hex(4))
        parts.save(storage, name, content)
        sha = parts.digest(content)
    part = {"n": n, "name": name, "rows": written, "bytes": size, "sha256": sha}
    with transaction.atomic():
        moved = Export.objects.filter(
            pk=row.pk, part_count=row.part_count, state=ExportState.RUNNING, manifest=""
        ).update(
            parts=[*row.parts, part],
            part_count=n,
            cursor=row.cursor if last_key is None else _json_key(last_key),
            rows_done=F("rows_done") + written,
            skipped=F("skipped") + len(skipped),
            skipped_keys=(row.skipped_keys + skipped)[:KEPT_KEYS],
        )
    if not moved:  # another attempt wrote this part (this one is a zombie): its file goes
        parts.discard(storage, name)
        return fetched, None
    telemetry.EXPORT_PARTS.inc()
    telemetry.EXPORT_ROWS.labels("written").inc(written)
    if skipped:
        telemetry.EXPORT_ROWS.labels("skipped").inc(len(skipped))
    return fetched, n


def first_rows(values: QuerySet[Any], limit: int, chunk: int) -> Iterator[Any]:
    """The first ``limit`` rows of ``values`` (ordered by key), ``chunk`` rows in memory at a
    time: through the database's cursor where the connection keeps one open, else (its
    ``DISABLE_SERVER_SIDE_CURSORS``: behind a transaction pooler, where a cursor cannot outlive
    its transaction and psycopg would read the whole part in one fetch) by key, one query per
    chunk. A chunk that ends inside a key (a to-many column) reads that key's rows whole,
    since the next one starts after the key."""
    if not connections[values.db].settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        yield from values[:limit].iterator(chunk_size=chunk)
        return
    after, fetched = None, 0
    while fetched < limit:
        want = min(chunk, limit - fetched)
        page = list((values if after is None else values.filter(pk__gt=after))[:want])
        if not page:
            return
        more = len(page) == want and fetched + want < limit
        last = page[-1][0]
        if more:  # (the key may be gone meanwhile: then none of its rows)
            page = [r for r in page if r[0] != last] + list(values.filter(pk=last))
        yield from page[: limit - fetched]
        fetched += min(len(page), limit - fetched)
        if not more:
            return
        after = last


def _encode_block(
    row: Export, encoder: parts.Encoder, block: list[tuple[Any, list[Any]]], skipped: list[Any]
) -> tuple[bytes, int]:
    """The block's bytes and how many rows they hold. A block with an invalid row is encoded
    again row by row: that row fails the export (its key named) or is skipped."""
    try:
        return encoder.block([values for _, values in block]), len(block)
    except parts.RowInvalid:
        encoder.reset()
    chunks = []
    for key, values in block:
        try:
            chunks.append(encoder.block([values]))
        except parts.RowInvalid as exc:
            encoder.reset()
            if row.on_invalid != "skip":
                raise ExportRowInvalid(
                    f"Export {row.uid}: the row with key {key!r} cannot be written as "
                    f"{row.format}: {exc}."
                ) from None
            skipped.append(_json_key(key))
    return b"".join(chunks), len(chunks)


def _json_key(value: Any) -> Any:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else str(value)


def manifest_of(row: Export) -> dict[str, Any]:
    return {
        "export": row.uid,
        "name": row.name,
        "format": row.format,
        "columns": row.columns,
        "rows": row.rows_done,
        "skipped": row.skipped,
        "skipped_keys": row.skipped_keys,
        "parts": [{k: p[k] for k in ("name", "rows", "bytes", "sha256")} for p in row.parts],
        "created_at": row.created_at,
    }


def close_parts(row: Export, upto: int) -> bool:
    """Close the parts after part ``upto``, which a read found the last (no rows after it):
    the manifest's name is recorded, and no part's compare and set matches after it. False:
    another attempt wrote a part after it (rows came) or closed them meanwhile."""
    return bool(
        Export.objects.filter(
            pk=row.pk, part_count=upto, state=ExportState.RUNNING, manifest=""
        ).update(manifest=parts.manifest_name(row.prefix))
    )


def finish(row: Export, storage: Any) -> None:
    """The parts are closed: the files no commit recorded go, the manifest is written (the
    same bytes whoever writes it), then the export is completed."""
    row.refresh_from_db()
    if row.state != ExportState.RUNNING:
        return
    kept = {part["name"] for part in row.parts} | {row.manifest}
    for name in row.stored_files(storage):
        if name not in kept:
            parts.discard(storage, name)
    parts.save_manifest(storage, row.manifest, manifest_of(row))
    Export.objects.filter(pk=row.pk, state=ExportState.RUNNING).update(
        state=ExportState.COMPLETED, finished_at=timezone.now()
    )
    log.info("export %s completed: %s rows in %s parts", row.uid, row.rows_done, row.part_count)


#: Exports, as a kind of job (registered in ``AppConfig.ready``).
EXPORT_KIND = JobKind("export", "exports", PREFIX, run=run, can_wait=False)
