"""An export's files: rows encoded as CSV or JSON lines, each part written to a local
temporary file (bounded memory) and saved under its name fixed in advance, the manifest last;
the storage an export writes to; its signed download links; retention.

A part's name is ``<prefix>part-<n>-<tag>.<ext>`` (n from 1, five digits; the tag is the
write's own): a write never replaces another's file, so a stalled worker that lost its lease
cannot overwrite a part that another attempt committed. The files that no commit recorded (a
killed try's, a zombie's) are deleted before the manifest is written. The manifest
(``<prefix>manifest.json``) lists every part with its name, rows, bytes and SHA-256: a reader
who finds it finds every part complete.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import hashlib
import io
import json
import re
import tempfile
import uuid
from datetime import timedelta
from typing import IO, Any

from django.core import signing
from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.core.serializers.json import DjangoJSONEncoder

#: What a value of an exported row may be.
PLAIN = (str, int, float, bool, decimal.Decimal, dt.date, dt.time, dt.timedelta, uuid.UUID)
EXTENSIONS = {"csv": "csv", "jsonl": "jsonl"}
#: A part is built in memory up to this many bytes, then on disk.
SPOOL_BYTES = 1024 * 1024
LINK_SALT = "feishu_inbox.exports.download"


class RowInvalid(ValueError):
    """A row that cannot be written, and why."""


def part_name(prefix: str, n: int, fmt: str, tag: str) -> str:
    return f"{prefix}part-{n:05d}-{tag}.{EXTENSIONS[fmt]}"


def manifest_name(prefix: str) -> str:
    return f"{prefix}manifest.json"


#: Values CSV takes as they are (``type(v) in``: no ``isinstance`` walk per value).
AS_IS = frozenset({str, int, float, type(None)})


def _csv_value(value: Any) -> Any:
    if type(value) in AS_IS or isinstance(value, str | int | float):
        return value
    if isinstance(value, PLAIN):
        return value.isoformat() if isinstance(value, dt.date | dt.time) else str(value)
    raise RowInvalid(f"a {type(value).__name__} has no CSV form")


class Encoder:
    """Encodes blocks of rows of one format into bytes. A block with a row that cannot be
    written raises ``RowInvalid``; the caller then encodes that block row by row to find it
    (the common block costs one ``writerows`` and one ``encode``)."""

    def __init__(self, fmt: str, columns: list[str]) -> None:
        self.fmt = fmt
        self.columns = columns
        self._text = io.StringIO()
        self._csv = csv.writer(self._text, lineterminator="\n")

    def header(self) -> bytes:
        if self.fmt != "csv":
            return b""
        self._csv.writerow(self.columns)
        return self._take()

    def block(self, rows: list[Any]) -> bytes:
        """Rows (each a sequence of the columns' values) as bytes, or ``RowInvalid``."""
        if self.fmt == "csv":
            as_is = AS_IS
            self._csv.writerows(
                [v if type(v) in as_is else _csv_value(v) for v in row] for row in rows
            )
            return self._take()
        columns = self.columns
        try:
            text = "".join(
                json.dumps(
                    dict(zip(columns, row, strict=True)),
                    cls=DjangoJSONEncoder,
                    ensure_ascii=False,
                    allow_nan=False,
                )
                + "\n"
                for row in rows
            )
        except (TypeError, ValueError) as exc:
            raise RowInvalid(str(exc)) from None
        return _encode(text)

    def _take(self) -> bytes:
        text = self._text.getvalue()
        self._text.seek(0)
        self._text.truncate()
        return _encode(text)

    def reset(self) -> None:
        """Forget what a refused block left half written."""
        self._text.seek(0)
        self._text.truncate()


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RowInvalid(f"text that UTF-8 cannot hold ({exc.reason})") from None


def spooled() -> IO[bytes]:
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, mode="w+b")


def save(storage: Storage, name: str, content: IO[bytes]) -> None:
    """Save ``content`` under exactly ``name``: what a killed try left there is removed first
    (a storage would otherwise pick another name)."""
    content.seek(0)
    if storage.exists(name):
        storage.delete(name)
    saved = storage.save(name, File(content, name=name.rsplit("/", 1)[-1]))
    if saved != name:  # a storage that renames: remove the copy, say so
        storage.delete(saved)
        raise OSError(f"the storage saved {name} as {saved}")


def save_manifest(storage: Storage, name: str, manifest: dict[str, Any]) -> None:
    """Write the manifest, unless it is there as it should be (another attempt of the same
    closed parts wrote it: the same bytes), so that it is never missing while it is
    replaced."""
    body = json.dumps(manifest, cls=DjangoJSONEncoder, indent=2, ensure_ascii=False) + "\n"
    data = body.encode("utf-8")
    if storage.exists(name):
        with storage.open(name, "rb") as found:
            if found.read() == data:
                return
        storage.delete(name)
    saved = storage.save(name, ContentFile(data))
    if saved != name:
        storage.delete(saved)
        raise OSError(f"the storage saved {name} as {saved}")


def discard(storage: Storage, name: str) -> None:
    """Delete a file no commit recorded (gone already: nothing to do)."""
    if storage.exists(name):
        storage.delete(name)


def digest(content: IO[bytes]) -> str:
    content.seek(0)
    sha = hashlib.sha256()
    while chunk := content.read(1 << 20):
        sha.update(chunk)
    return sha.hexdigest()


#: The arguments a storage object may be passed with (a file system's: FileSystemStorage's,
#: InMemoryStorage's): what a storage is made with is written to the export's row, so a
#: storage made with anything else (a bucket's keys, a connection string, a password nested
#: in its options or a URL's user) is passed by its alias of settings.STORAGES instead.
PLAIN_ARGUMENTS = frozenset(
    {
        "location",
        "base_url",
        "file_permissions_mode",
        "directory_permissions_mode",
        "allow_overwrite",
    }
)
#: A URL with a user (and maybe a password) in it: ``scheme://user:pass@host``.
URL_USER = re.compile(r"://[^/@\s]*@")


def storage_spec(storage: Storage | str | None) -> dict[str, Any]:
    """How a worker finds the storage again: an alias of settings.STORAGES, or a storage
    that deconstructs (every Django and django-storages storage does) and is made with no
    more than a file system's arguments."""
    if storage is None:
        return {"alias": "default"}
    if isinstance(storage, str):
        storages[storage]  # raises InvalidStorageError for an unknown alias
        return {"alias": storage}
    path, args, kwargs = storage.deconstruct()  # type: ignore[attr-defined]
    other = sorted(k for k in kwargs if k not in PLAIN_ARGUMENTS)
    if args or other or any(URL_USER.search(str(v)) for v in kwargs.values()):
        made_with = ", ".join([*(["positional arguments"] if args else []), *other]) or "a URL"
        raise ValueError(
            f"the storage was made with {made_with}, which would be stored in the export's row "
            "in the database (and may hold a credential): name it in settings.STORAGES and "
            "pass its alias (storage='exports')"
        )
    # JSON, as the worker will read it (a location given as a Path becomes its text).
    return json.loads(json.dumps({"path": path, "args": list(args), "kwargs": kwargs}, default=str))


def download_token(uid: str, filename: str) -> str:
    return signing.TimestampSigner(salt=LINK_SALT).sign(f"{uid}|{filename}")


def read_token(token: str, max_age: float) -> tuple[str, str]:
    """(uid, filename) of a link; ``signing.BadSignature`` (or ``SignatureExpired``)."""
    value = signing.TimestampSigner(salt=LINK_SALT).unsign(
        token, max_age=timedelta(seconds=max_age)
    )
    uid, filename = value.split("|", 1)
    return uid, filename
