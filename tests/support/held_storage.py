"""A file-system storage that stops a worker at a chosen point of an export part's write, so
that a test kills it there and knows where the kill landed, whatever the machine's load.

The test names the point in ``<location>.hold``:

- ``before``: the part's rows are read and encoded, nothing of it is in the storage yet;
- ``half``: half of the part's bytes are in its file (a torn write);
- ``after``: the whole file is written, and the export's row does not record it yet.

The storage's next part save stops there and writes ``<point> <name>`` to ``<location>.held``;
it goes on only if the hold file goes (a test kills the worker instead). Both files sit beside
the storage's folder, never in it: the export's own listing does not see them. The storage is
made with its location only, as an export's storage must be (it is written to the row)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django.core.files.storage import FileSystemStorage
from django.utils.deconstruct import deconstructible

POINTS = ("before", "half", "after")


@deconstructible(path="tests.support.held_storage.HeldStorage")
class HeldStorage(FileSystemStorage):
    def _save(self, name: str, content: Any) -> str:
        point = self._point() if "/part-" in f"/{name}" else ""
        if point == "before":
            self._hold(point, name)
        elif point == "half":
            content.seek(0)
            data = content.read()
            path = Path(self.path(name))
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as torn:
                torn.write(data[: len(data) // 2])
                torn.flush()
                os.fsync(torn.fileno())
            self._hold(point, name)
            path.unlink()  # let go of (no test does): the write starts again whole
            content.seek(0)
        saved = super()._save(name, content)
        if point == "after":
            self._hold(point, name)
        return saved

    def _point(self) -> str:
        try:
            point = Path(f"{self.location}.hold").read_text().strip()
        except FileNotFoundError:
            return ""
        return point if point in POINTS else ""

    def _hold(self, point: str, name: str) -> None:
        held = Path(f"{self.location}.held")
        fresh = held.with_suffix(".held-new")
        fresh.write_text(f"{point} {name}")
        fresh.replace(held)  # whole, at once: the test never reads half of it
        hold = Path(f"{self.location}.hold")
        while hold.exists():
            time.sleep(0.01)  # the worker waits here for its SIGKILL
