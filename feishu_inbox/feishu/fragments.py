"""Messages the long connection receives split over several frames, joined again.

A part names its message (``message_id``), how many parts it has (``sum``) and which it is
(``seq``). Parts that stop coming are dropped after ``FRAGMENT_TTL_SECONDS``; at most
``MAX_PENDING_MESSAGES`` wait at once, and no message may outgrow the body limit.
"""

from __future__ import annotations

import logging
import time

from .frames import Frame
from .protocol import ProtocolError

log = logging.getLogger("feishu_inbox.connection")

#: A message split over frames must arrive whole within this many seconds.
FRAGMENT_TTL_SECONDS = 10.0
MAX_PENDING_MESSAGES = 1000


class Fragments:
    """Messages split over frames (``sum`` > 1), joined by ``message_id``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending: dict[str, tuple[float, int, dict[int, bytes]]] = {}

    def add(self, message_id: str, total: int, seq: int, part: bytes) -> bytes | None:
        """The whole payload once its last part arrived, else None; ``ProtocolError`` for a
        part that cannot belong to a message."""
        now = time.monotonic()
        for key in [k for k, (at, _, _) in self.pending.items() if now - at > FRAGMENT_TTL_SECONDS]:
            log.warning("dropped an incomplete message %s: its parts stopped coming", key)
            del self.pending[key]
        if not 0 <= seq < total:
            raise ProtocolError("bad_frame", f"part {seq} of {total} is out of range.")
        at, known, parts = self.pending.get(message_id, (now, total, {}))
        if known != total:
            raise ProtocolError("bad_frame", f"the parts of {message_id} disagree on their sum.")
        parts[seq] = part
        if sum(len(p) for p in parts.values()) > self.limit:
            self.pending.pop(message_id, None)
            raise ProtocolError("too_large", f"The event is over {self.limit} bytes.")
        if len(parts) < total:
            if message_id not in self.pending and len(self.pending) >= MAX_PENDING_MESSAGES:
                oldest = min(self.pending, key=lambda k: self.pending[k][0])
                log.warning("dropped an incomplete message %s: too many pending", oldest)
                del self.pending[oldest]
            self.pending[message_id] = (at, total, parts)
            return None
        self.pending.pop(message_id, None)
        return b"".join(parts[i] for i in range(total))


def int_header(frame: Frame, name: str, default: int) -> int:
    """A frame's header as a number (``sum``, ``seq``); ``ProtocolError`` when it is not one."""
    value = frame.header(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ProtocolError("bad_frame", f"The frame's {name} header is not a number.") from None
