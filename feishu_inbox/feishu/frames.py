"""The long connection's frames: protobuf ``pbbp2.Frame``, encoded and decoded here.

The message is small and fixed (``lark_oapi/ws/pb/pbbp2.proto``, proto2)::

    message Header { required string key = 1; required string value = 2; }
    message Frame {
      required uint64 SeqID = 1; required uint64 LogID = 2;
      required int32 service = 3; required int32 method = 4;
      repeated Header headers = 5;
      optional string payload_encoding = 6; optional string payload_type = 7;
      optional bytes payload = 8; optional string LogIDNew = 9;
    }

Its wire format takes about a hundred lines, so the connection process need not import the SDK
(100 MB, 2.3 s to import, and its bundled protobuf runtime) to read a frame; ``tests/feishu/
test_frames.py`` proves these bytes equal the SDK's own ``Frame`` in both directions. Anything
that is not such a frame raises ``FrameError`` (a ``ValueError``), never another exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

CONTROL = 0  # method: ping and pong
DATA = 1  # method: an event (or a card callback) and its ACK

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_U64 = (1 << 64) - 1


class FrameError(ValueError):
    """Bytes that are not a ``pbbp2.Frame``; the message says where they stopped being one."""


@dataclass(frozen=True)
class Frame:
    seq_id: int = 0
    log_id: int = 0
    service: int = 0
    method: int = CONTROL
    #: In the order they came; a key may repeat (the first one counts, as in the SDK).
    headers: tuple[tuple[str, str], ...] = ()
    payload_encoding: str | None = None
    payload_type: str | None = None
    payload: bytes | None = None
    log_id_new: str | None = None
    #: Fields this codec does not know, kept as raw (number, wire type, bytes) so an echo
    #: sends them back unchanged.
    unknown: tuple[tuple[int, int, bytes], ...] = field(default=(), compare=False)

    def header(self, key: str) -> str | None:
        for k, v in self.headers:
            if k == key:
                return v
        return None

    def with_headers(self, **extra: str) -> Frame:
        """A copy with ``extra`` headers appended (an ACK's ``biz_rt``)."""
        return replace(self, headers=self.headers + tuple(extra.items()))

    def encode(self) -> bytes:
        out = bytearray()
        _key(out, 1, _VARINT)
        _varint(out, self.seq_id & _U64)
        _key(out, 2, _VARINT)
        _varint(out, self.log_id & _U64)
        _key(out, 3, _VARINT)
        _varint(out, self.service & _U64)  # int32: negatives take ten bytes, as protobuf's
        _key(out, 4, _VARINT)
        _varint(out, self.method & _U64)
        for key, value in self.headers:
            inner = bytearray()
            _bytes(inner, 1, key.encode())
            _bytes(inner, 2, value.encode())
            _bytes(out, 5, bytes(inner))
        if self.payload_encoding is not None:
            _bytes(out, 6, self.payload_encoding.encode())
        if self.payload_type is not None:
            _bytes(out, 7, self.payload_type.encode())
        if self.payload is not None:
            _bytes(out, 8, self.payload)
        if self.log_id_new is not None:
            _bytes(out, 9, self.log_id_new.encode())
        for number, wire, raw in self.unknown:
            _key(out, number, wire)
            out += raw
        return bytes(out)


def decode(data: bytes) -> Frame:
    """The frame in ``data``; ``FrameError`` if it is not one (or lacks a required field)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FrameError(f"a frame is binary, not {type(data).__name__}")
    values: dict[int, object] = {}
    headers: list[tuple[str, str]] = []
    unknown: list[tuple[int, int, bytes]] = []
    for number, wire, value, raw in _fields(bytes(data)):
        if number in (1, 2, 3, 4):
            _expect(number, wire, _VARINT)
            values[number] = value
        elif number == 5:
            _expect(number, wire, _LEN)
            headers.append(_header(value))
        elif number in (6, 7, 8, 9):
            _expect(number, wire, _LEN)
            values[number] = value
        else:
            unknown.append((number, wire, raw))
    missing = [name for n, name in _REQUIRED if n not in values]
    if missing:
        raise FrameError(f"the frame lacks its required {', '.join(missing)}")
    return Frame(
        seq_id=values[1],  # type: ignore[arg-type]
        log_id=values[2],  # type: ignore[arg-type]
        service=_int32(values[3], "service"),  # type: ignore[arg-type]
        method=_int32(values[4], "method"),  # type: ignore[arg-type]
        headers=tuple(headers),
        payload_encoding=_text(values.get(6), "payload_encoding"),
        payload_type=_text(values.get(7), "payload_type"),
        payload=values.get(8),  # type: ignore[arg-type]
        log_id_new=_text(values.get(9), "LogIDNew"),
        unknown=tuple(unknown),
    )


_REQUIRED = ((1, "SeqID"), (2, "LogID"), (3, "service"), (4, "method"))


def _key(out: bytearray, number: int, wire: int) -> None:
    _varint(out, number << 3 | wire)


def _varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _bytes(out: bytearray, number: int, value: bytes) -> None:
    _key(out, number, _LEN)
    _varint(out, len(value))
    out += value


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise FrameError("the frame ends inside a number")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value > _U64:
                raise FrameError("a number in the frame is over 64 bits")
            return value, pos
        shift += 7
        if shift >= 70:
            raise FrameError("a number in the frame is over ten bytes long")


def _fields(data: bytes):  # type: ignore[no-untyped-def]
    """(number, wire type, value, raw bytes after the key) of each field in ``data``."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise FrameError("the frame has a field numbered 0")
        start = pos
        value: object
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
        elif wire == _LEN:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise FrameError("a field runs past the end of the frame")
            value, pos = data[pos : pos + length], pos + length
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
            if pos + size > len(data):
                raise FrameError("a field runs past the end of the frame")
            value, pos = data[pos : pos + size], pos + size
        else:
            raise FrameError(f"field {number} has wire type {wire}, which no frame uses")
        yield number, wire, value, data[start:pos]


def _expect(number: int, wire: int, expected: int) -> None:
    if wire != expected:
        raise FrameError(f"field {number} has wire type {wire}, not {expected}")


def _int32(value: int, name: str) -> int:
    value &= _U64
    if value >= 1 << 63:
        value -= 1 << 64
    if not -(1 << 31) <= value < 1 << 31:
        raise FrameError(f"the frame's {name} is not a 32-bit number")
    return value


def _text(value: object, name: str) -> str | None:
    if value is None:
        return None
    try:
        return bytes(value).decode()  # type: ignore[call-overload]
    except UnicodeDecodeError:
        raise FrameError(f"the frame's {name} is not UTF-8") from None


def _header(data: bytes) -> tuple[str, str]:
    found: dict[int, str] = {}
    for number, wire, value, _raw in _fields(data):
        if number in (1, 2):
            _expect(number, wire, _LEN)
            found[number] = _text(value, "header") or ""
    if 1 not in found or 2 not in found:
        raise FrameError("a header lacks its key or its value")
    return found[1], found[2]
