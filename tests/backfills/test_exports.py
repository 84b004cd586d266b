"""Exports in one process (SPEC §9i): numbered parts, each under a name of its write's own, a
manifest last that lists each with its name, rows, bytes and checksum; a stalled attempt
(a zombie) never replaces a committed part or manifest, and its files go; a to-many column
never splits a key between parts; rows read back equal the queryset; an invalid row fails
the export or is skipped by policy; a part too large fails it; admin's download links are
signed, expire, and need the permission; retention removes old exports. Kills mid-part and
memory on real workers are in ``test_export_workers.py``."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import itertools
import json
import pickle
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core import signing
from django.core.files.storage import FileSystemStorage
from django.core.management import call_command
from django.db import transaction
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

import feishu_inbox
from feishu_inbox.backfills import exports, parts
from feishu_inbox.errors import LedgerError
from feishu_inbox.models import EventJob
from feishu_inbox.tables.backfills import Export
from tests.support import backfill_jobs
from tests.support.backfill_jobs import Row

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("runworker", "--burst", "--concurrency", "1", "-v", "0")


def read_parts(root: Path, export: Export) -> list[list[str]]:
    """Every data row of every part, as text, in part order (CSV: the header checked)."""
    rows: list[list[str]] = []
    for part in export.parts:
        text = (root / part["name"]).read_text(encoding="utf-8")
        if export.format == "csv":
            found = list(csv.reader(io.StringIO(text)))
            assert found[0] == export.columns
            rows += found[1:]
        else:
            rows += [[str(v) for v in json.loads(line).values()] for line in text.splitlines()]
    return rows


def manifest(root: Path, export: Export) -> dict[str, Any]:
    return json.loads((root / export.manifest).read_text())  # type: ignore[no-any-return]


def test_an_export_writes_numbered_parts_and_a_manifest_last(table: Any, tmp_path: Path) -> None:
    backfill_jobs.fill_table(2345)
    storage = FileSystemStorage(location=tmp_path)
    with transaction.atomic():
        handle = feishu_inbox.export(
            "rows", Row.objects.all(), columns=["id", "label"], part_rows=1000, storage=storage
        )
    burst()
    done = Export.objects.get(uid=handle.uid)
    assert (done.state, done.rows_done, done.part_count) == ("completed", 2345, 3)
    names = [p["name"] for p in done.parts]
    assert [
        re.fullmatch(rf"{handle.prefix}part-0000(\d)-[0-9a-f]{{8}}\.csv", n)[1] for n in names
    ] == [  # type: ignore[index]
        "1",
        "2",
        "3",
    ]
    assert handle.prefix.startswith("feishu_inbox/exports/rows/exp_")
    assert read_parts(tmp_path, done) == [[str(i), f"row {i}"] for i in range(1, 2346)]
    found = manifest(tmp_path, done)
    assert found["rows"] == 2345 and [p["rows"] for p in found["parts"]] == [1000, 1000, 345]
    for part in found["parts"]:
        body = (tmp_path / part["name"]).read_bytes()
        assert (len(body), hashlib.sha256(body).hexdigest()) == (part["bytes"], part["sha256"])
    assert sorted(p.name for p in (tmp_path / handle.prefix).iterdir()) == sorted(
        ["manifest.json", *(n.rsplit("/", 1)[1] for n in names)]
    )
    assert EventJob.objects.get(pk=handle.job_id).status == "completed"


def test_a_zombie_never_replaces_a_committed_part_or_the_manifest_and_its_files_go(
    table: Any, tmp_path: Path
) -> None:
    """Two attempts of one export: the one that lost its lease (a zombie, here its stale row)
    writes the part another attempt committed: its commit matches nothing and its file goes;
    the committed part's bytes are the manifest's. A file that a killed write left is gone
    once the export completes; after it, a zombie's part and finish change nothing."""
    backfill_jobs.fill_table(250)
    storage = FileSystemStorage(location=tmp_path)
    handle = feishu_inbox.export(
        "zombie", Row.objects.all(), columns=["id", "label"], part_rows=100, storage=storage
    )
    stale = Export.objects.get(uid=handle.uid)
    queryset = exports.unseal(stale)
    assert exports.write_part(Export.objects.get(uid=handle.uid), queryset, storage) == (100, 1)
    committed = Export.objects.get(uid=handle.uid).parts[0]
    body = (tmp_path / committed["name"]).read_bytes()
    Row.objects.filter(pk=5).update(label="changed after the part")  # the zombie reads it
    assert exports.write_part(stale, queryset, storage) == (100, None)
    assert (tmp_path / committed["name"]).read_bytes() == body
    assert sorted(p.name for p in (tmp_path / handle.prefix).iterdir()) == [
        committed["name"].rsplit("/", 1)[1]
    ]
    left = f"{handle.prefix}part-00002-deadbeef.csv"  # a write killed before its commit
    (tmp_path / left).write_text("id,label\n")
    burst()
    done = Export.objects.get(uid=handle.uid)
    assert (done.state, done.rows_done, done.part_count) == ("completed", 250, 3)
    assert done.parts[0] == committed
    files = sorted(p.name for p in (tmp_path / handle.prefix).iterdir())
    assert files == sorted(["manifest.json", *(p["name"].rsplit("/", 1)[1] for p in done.parts)])
    written = (tmp_path / done.manifest).read_bytes()
    for part in manifest(tmp_path, done)["parts"]:
        assert hashlib.sha256((tmp_path / part["name"]).read_bytes()).hexdigest() == part["sha256"]
    # After it completed: a zombie of the last part, and of its finish.
    last = Export.objects.get(uid=handle.uid)
    last.parts, last.part_count, last.manifest = last.parts[:2], 2, ""
    last.cursor, last.state = 200, "running"
    Row.objects.create(id=251, label="row 251")
    assert exports.write_part(last, queryset, storage) == (51, None)
    exports.finish(last, storage)
    assert (tmp_path / done.manifest).read_bytes() == written
    assert sorted(p.name for p in (tmp_path / handle.prefix).iterdir()) == files


def test_a_to_many_column_never_splits_a_key_between_parts(table: Any, tmp_path: Path) -> None:
    """A to-many column repeats each key once per related row: the part that reaches
    ``part_rows`` inside a key takes that key's other rows too (here a user of 7 groups in
    parts of 4 rows), so every (user, group) row is written once."""
    groups = [Group.objects.create(name=f"g{n}") for n in range(7)]
    for n, count in enumerate([1, 3, 7, 0, 2, 2, 5]):
        User.objects.create_user(f"u{n}").groups.set(groups[:count])
    storage = FileSystemStorage(location=tmp_path)
    handle = feishu_inbox.export(
        "members",
        User.objects.all(),
        columns=["username", "groups__name"],
        part_rows=4,
        storage=storage,
    )
    burst()
    done = Export.objects.get(uid=handle.uid)
    expected = sorted(User.objects.values_list("username", "groups__name"))
    written = read_parts(tmp_path, done)
    assert sorted((u, g or None) for u, g in written) == expected
    by_part = [
        {row[0] for row in list(csv.reader(io.StringIO((tmp_path / p["name"]).read_text())))[1:]}
        for p in done.parts
    ]
    assert all(not (a & b) for a, b in itertools.combinations(by_part, 2)), by_part


@pytest.mark.parametrize("server_side_cursors", [True, False], ids=["cursor", "by-key"])
def test_a_part_is_read_a_chunk_at_a_time_and_no_key_is_split(
    table: Any, tmp_path: Path, server_side_cursors: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part is read ``chunk_size`` rows at a time: through the connection's cursor, or
    without one (``DISABLE_SERVER_SIDE_CURSORS``, as behind PgBouncer) by key, one query per
    chunk; a chunk that ends inside a key reads that key whole. Chunks of 3 rows of users of
    up to 7 groups, in parts of 10: every (user, group) row written once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setitem(
        connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", not server_side_cursors
    )
    groups = [Group.objects.create(name=f"g{n}") for n in range(7)]
    for n, count in enumerate([1, 3, 7, 0, 2, 2, 5, 6, 1, 4, 7, 3]):
        User.objects.create_user(f"u{n:02d}").groups.set(groups[:count])
    expected = sorted(User.objects.values_list("username", "groups__name"))
    values = User.objects.order_by("pk").values_list("pk", "username", "groups__name")
    with CaptureQueriesContext(connection) as queries:
        read = list(exports.first_rows(values, len(expected), 3))
    assert sorted((u, g) for _, u, g in read) == expected
    if not server_side_cursors:  # one query per chunk, plus the key a chunk ended inside
        assert len(queries) >= len(expected) // 3
    storage = FileSystemStorage(location=tmp_path)
    handle = feishu_inbox.export(
        "members",
        User.objects.all(),
        columns=["username", "groups__name"],
        part_rows=10,
        chunk_size=3,
        storage=storage,
    )
    burst()
    done = Export.objects.get(uid=handle.uid)
    assert done.state == "completed", done.error
    written = read_parts(tmp_path, done)
    assert sorted((u, g or None) for u, g in written) == expected


def test_jsonl_of_a_filtered_queryset_and_an_empty_one(table: Any, tmp_path: Path) -> None:
    backfill_jobs.fill_table(300)
    Row.objects.filter(pk__lte=10).update(data={"tags": ["a", "b"]})
    storage = FileSystemStorage(location=tmp_path)
    wanted = Row.objects.filter(pk__lte=150, pk__gt=3)
    handle = feishu_inbox.export(
        "some", wanted, columns=["id", "data"], format="jsonl", part_rows=50, storage=storage
    )
    empty = feishu_inbox.export(
        "none", Row.objects.filter(pk__lt=0), columns=["id"], storage=storage
    )
    burst()
    done = Export.objects.get(uid=handle.uid)
    lines = [
        json.loads(line)
        for p in done.parts
        for line in (tmp_path / p["name"]).read_text().splitlines()
    ]
    assert [r["id"] for r in lines] == list(range(4, 151))
    assert lines[0] == {"id": 4, "data": {"tags": ["a", "b"]}} and lines[-1]["data"] is None
    assert done.part_count == 3 and re.search(r"part-00003-\w+\.jsonl$", done.parts[-1]["name"])
    nothing = Export.objects.get(uid=empty.uid)
    assert (nothing.state, nothing.rows_done, nothing.part_count) == ("completed", 0, 1)
    assert manifest(tmp_path, nothing)["rows"] == 0


def test_an_invalid_row_fails_the_export_with_its_key_or_is_skipped(
    table: Any, tmp_path: Path
) -> None:
    backfill_jobs.fill_table(100)
    Row.objects.filter(pk__in=[37, 80]).update(data={"not": "csv"})
    storage = FileSystemStorage(location=tmp_path)
    failing = feishu_inbox.export(
        "strict", Row.objects.all(), columns=["id", "data"], part_rows=30, storage=storage
    )
    skipping = feishu_inbox.export(
        "lenient",
        Row.objects.all(),
        columns=["id", "data"],
        part_rows=30,
        storage=storage,
        on_invalid="skip",
    )
    burst()
    failed = Export.objects.get(uid=failing.uid)
    assert failed.state == "failed" and failed.manifest == ""
    assert failed.error.startswith("[export_row_invalid]") and "key 37" in failed.error
    assert failed.part_count == 1  # the first part was written; no manifest says it is whole
    assert not (tmp_path / failing.prefix / "manifest.json").exists()
    job = EventJob.objects.get(pk=failing.job_id)
    assert (job.status, job.error_type) == ("completed", "ExportRowInvalid")
    skipped = Export.objects.get(uid=skipping.uid)
    assert (skipped.state, skipped.rows_done, skipped.skipped) == ("completed", 98, 2)
    assert skipped.skipped_keys == [37, 80]
    ids = [int(r[0]) for r in read_parts(tmp_path, skipped)]
    assert ids == [i for i in range(1, 101) if i not in (37, 80)]
    assert manifest(tmp_path, skipped)["skipped_keys"] == [37, 80]


def test_a_part_over_its_bytes_fails_the_export(table: Any, tmp_path: Path) -> None:
    backfill_jobs.fill_table(500)
    handle = feishu_inbox.export(
        "big",
        Row.objects.all(),
        columns=["id", "label"],
        part_rows=400,
        max_part_bytes=2000,
        storage=FileSystemStorage(location=tmp_path),
    )
    burst()
    failed = Export.objects.get(uid=handle.uid)
    assert failed.state == "failed" and failed.error.startswith("[export_part_too_large]")
    assert failed.part_count == 0 and not (tmp_path / handle.prefix).exists()


class WithSecret(FileSystemStorage):
    """A storage made with a credential (as django-storages' S3 storage with ``secret_key``)."""

    def __init__(self, secret_key: str = "s3cr3t", **kwargs: Any) -> None:  # noqa: S107
        super().__init__(**kwargs)
        self._constructor_args = ((), {"secret_key": secret_key, **kwargs})


class Made(FileSystemStorage):
    """A storage that deconstructs into whatever it was made with (as django-storages' do)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._constructor_args = ((), kwargs)


def test_an_export_is_refused_with_every_problem_and_exists_only_if_its_caller_commits(
    table: Any,
) -> None:
    with pytest.raises(LedgerError) as caught:
        feishu_inbox.export("a/b", Row.objects.all(), columns=[], format="xml", part_rows=0)
    text = str(caught.value)
    assert all(word in text for word in ("name", "columns", "format", "part_rows"))
    for bad in ("..", "../up", ".hidden", "a" * 201):
        with pytest.raises(LedgerError, match="names a folder"):
            feishu_inbox.export(bad, Row.objects.all(), columns=["id"])
    with pytest.raises(LedgerError, match=r"secret_key.*settings\.STORAGES"):
        feishu_inbox.export("x", Row.objects.all(), columns=["id"], storage=WithSecret())
    # What a storage is made with is written to the row: a credential nested in its options,
    # a connection string or a URL's user would be too, so only a file system's arguments go.
    for made_with in (
        {"params": {"password": "hunter2"}},
        {"connection_string": "AccountName=x;AccountKey=c2VjcmV0"},
        {"location": "ftp://user:hunter2@files.example.com/exports"},
    ):
        with pytest.raises(LedgerError, match=r"settings\.STORAGES") as caught:
            feishu_inbox.export("x", Row.objects.all(), columns=["id"], storage=Made(**made_with))
        assert "hunter2" not in str(caught.value) and "c2VjcmV0" not in str(caught.value)
    # Queries the worker could not read in key order after a key: every attempt would fail.
    for query, why in (
        (Row.objects.all()[:5], "sliced"),
        (Row.objects.filter(id=1).union(Row.objects.filter(id=2)), "union"),
    ):
        with pytest.raises(LedgerError, match=why):
            feishu_inbox.export("x", query, columns=["id"])
    for bad in (-1, 0, "big", True, 2**63):
        with pytest.raises(LedgerError, match="max_part_bytes must be a whole number"):
            feishu_inbox.export("x", Row.objects.all(), columns=["id"], max_part_bytes=bad)
    with pytest.raises(LedgerError, match="chunk_size must be a whole number"):
        feishu_inbox.export("x", Row.objects.all(), columns=["id"], chunk_size=2**31)
    with pytest.raises(LedgerError, match=r"storage: .*nowhere"):
        feishu_inbox.export("x", Row.objects.all(), columns=["id"], storage="nowhere")
    with pytest.raises(LedgerError, match="columns do not fit"):
        feishu_inbox.export("x", Row.objects.all(), columns=["no_such_field"])
    with pytest.raises(RuntimeError), transaction.atomic():
        feishu_inbox.export("x", Row.objects.all(), columns=["id"])
        raise RuntimeError("the caller rolls back")
    assert not Export.objects.exists() and not EventJob.objects.exists()


def operator(*perms: str) -> Client:
    user = User.objects.create_user("op-" + "-".join(perms or ("none",)), is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_export", "view_backfill", *perms])
    )
    client = Client()
    client.force_login(user)
    return client


def test_admin_download_links_need_the_permission_and_expire(table: Any, tmp_path: Path) -> None:
    backfill_jobs.fill_table(10)
    handle = feishu_inbox.export(
        "dl", Row.objects.all(), columns=["id"], storage=FileSystemStorage(location=tmp_path)
    )
    burst()
    export = Export.objects.get(uid=handle.uid)
    page = reverse("admin:feishu_inbox_export_change", args=[export.pk])
    viewer = operator()
    shown = viewer.get(page).content.decode()
    assert "part-00001-" in shown and "download/" not in shown
    downloader = operator("download_export")
    shown = downloader.get(page).content.decode()
    links = [part.split('"')[0] for part in shown.split('href="')[1:] if "/download/" in part]
    assert len(links) == 2  # the part and the manifest
    got = downloader.get(links[0])
    assert got.status_code == 200
    assert b"".join(got.streaming_content) == (tmp_path / export.parts[0]["name"]).read_bytes()
    assert viewer.get(links[0]).status_code == 403
    with override_settings(FEISHU_INBOX={"EXPORT_LINK_SECONDS": 1e-6}):
        assert downloader.get(links[0]).status_code == 410
    forged = parts.download_token(export.uid, export.parts[0]["name"].rsplit("/", 1)[1])
    forged = forged[:-2] + "xx"
    assert (
        downloader.get(reverse("admin:feishu_inbox_export_download", args=[forged])).status_code
        == 404
    )


def test_retention_removes_old_exports_files_and_rows(table: Any, tmp_path: Path) -> None:
    backfill_jobs.fill_table(10)
    storage = FileSystemStorage(location=tmp_path)
    old = feishu_inbox.export("old", Row.objects.all(), columns=["id"], storage=storage)
    new = feishu_inbox.export("new", Row.objects.all(), columns=["id"], storage=storage)
    burst()
    Export.objects.filter(uid=old.uid).update(finished_at=timezone.now() - timedelta(days=8))
    call_command("inbox", "purge")
    assert list(Export.objects.values_list("uid", flat=True)) == [new.uid]
    assert not any((tmp_path / old.prefix).iterdir())
    assert (tmp_path / new.prefix / "manifest.json").exists()


def test_a_query_whose_signature_does_not_hold_is_never_unpickled(table: Any) -> None:
    handle = feishu_inbox.export("x", Row.objects.all(), columns=["id"])
    sealed = Export.objects.get(uid=handle.uid).query
    middle = len(sealed) // 2
    flipped = "A" if sealed[middle] != "A" else "B"
    tampered = sealed[:middle] + flipped + sealed[middle + 1 :]
    Export.objects.filter(uid=handle.uid).update(query=tampered)
    burst()
    failed = Export.objects.get(uid=handle.uid)
    assert failed.state == "failed" and "BadSignature" in failed.error
    job = EventJob.objects.get(pk=handle.job_id)
    assert (job.status, job.error_type) == ("completed", "ExportQueryUnreadable")


def test_an_export_reads_the_database_its_queryset_was_given(
    table: Any, other_database: str, tmp_path: Path
) -> None:
    """``using()`` is the queryset's, not its query's: the worker reads that database (the
    part written here, in this thread: the second alias is this thread's connection only)."""
    Row.objects.using(other_database).bulk_create([Row(id=n, label=f"other {n}") for n in (1, 2)])
    Row.objects.bulk_create([Row(id=n, label=f"default {n}") for n in (1, 2, 3)])
    storage = FileSystemStorage(location=tmp_path)
    handle = feishu_inbox.export(
        "other", Row.objects.using(other_database).all(), columns=["id", "label"], storage=storage
    )
    row = Export.objects.get(uid=handle.uid)
    assert exports.unseal(row).db == other_database
    exports.write_part(row, exports.unseal(row), storage)
    assert read_parts(tmp_path, Export.objects.get(uid=handle.uid)) == [
        ["1", "other 1"],
        ["2", "other 2"],
    ]
    assert exports.unseal(Export(query=exports.seal(Row.objects.all()))).db == "default"
    # An export enqueued before the alias was kept: its query alone, read as before.
    query = base64.b64encode(pickle.dumps(Row.objects.filter(id=2).query)).decode()
    legacy = signing.Signer(salt=exports.QUERY_SALT).sign(query)
    assert list(exports.unseal(Export(query=legacy)).values_list("label", flat=True)) == [
        "default 2"
    ]


def test_an_export_whose_job_is_cancelled_fails_and_is_purged(table: Any, tmp_path: Path) -> None:
    """An operator's cancel of an export's job that has not run (or runs) ends the export as
    failed, never running for ever: retention then removes it and its files."""
    from feishu_inbox.ledger import operators

    backfill_jobs.fill_table(30)
    storage = FileSystemStorage(location=tmp_path)
    handle = feishu_inbox.export(
        "cancelled", Row.objects.all(), columns=["id"], part_rows=10, storage=storage
    )
    row = Export.objects.get(uid=handle.uid)
    exports.write_part(row, exports.unseal(row), storage)  # a part landed, then the job stops
    operators.cancel([handle.job_id])
    burst()
    assert EventJob.objects.get(pk=handle.job_id).status == "completed"
    call_command("inbox", "purge")
    failed = Export.objects.get(uid=handle.uid)
    assert failed.state == "failed" and "cancelled" in failed.error and failed.finished_at
    Export.objects.filter(uid=handle.uid).update(finished_at=timezone.now() - timedelta(days=30))
    call_command("inbox", "purge")
    assert not Export.objects.filter(uid=handle.uid).exists()
    assert not list((tmp_path / handle.prefix).iterdir())
