"""A streamed reply's state in the ledger (``feishu/streams.py``; SPEC §9b).

One row per job, replay generation and stream name: the CardKit card, the message that
carries it, the last operation's ``sequence`` and the text sent with it. The streamer writes
the row, fenced by the job's lease, *before* each card operation leaves, so whatever a crash
interrupts, a later attempt reads a sequence at least as high as any Feishu has seen and a text
at least as long as any the user has seen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from ..errors import LeaseLost
from ..store import store
from ..store.base import aware
from .rules import Lease


@dataclass(frozen=True)
class CardState:
    card_id: str
    element_id: str
    message_id: str = ""
    #: The last sequence written here (sent, or about to be).
    sequence: int = 0
    #: The answer's text sent (or about to be) with that sequence, without the marker.
    text: str = ""
    #: The card shows ``text`` followed by the interruption marker.
    marked: bool = False
    streaming: bool = True
    streaming_since: datetime | None = None
    closed: bool = False

    def but(self, **changes: Any) -> CardState:
        return replace(self, **changes)


def load(job_id: int, name: str) -> CardState | None:
    """The job's stream ``name`` as the ledger last recorded it, or None."""
    row = store().card_stream(job_id, name)
    if row is None:
        return None
    return CardState(
        card_id=row["card_id"],
        element_id=row["element_id"],
        message_id=row["message_id"] or "",
        sequence=int(row["sequence"]),
        text=row["text"] or "",
        marked=bool(row["marked"]),
        streaming=bool(row["streaming"]),
        streaming_since=aware(row["streaming_since"]),
        closed=bool(row["closed"]),
    )


def save(lease: Lease, name: str, state: CardState) -> None:
    """Record the stream's state, fenced; ``LeaseLost`` (nothing written) once the lease is
    gone. Repeating a save writes the same values: safe to try again after a lost reply."""
    if not store().save_card_stream(lease, name, asdict(state)):
        raise LeaseLost(
            f"Job {lease.job_id} lost its lease; its streamed reply {name!r} was not updated."
        )
