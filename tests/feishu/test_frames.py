"""The long connection's frame codec is the SDK's ``pbbp2.Frame``, byte for byte, both ways;
and whatever bytes come, it answers a Frame or a FrameError, nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lark_oapi.ws.pb.pbbp2_pb2 import Frame as SdkFrame

from feishu_inbox.feishu import frames
from feishu_inbox.feishu.frames import Frame, FrameError

# No test database here (a SQLite file of its own at most): the SQLite suite runs it once.
pytestmark = pytest.mark.any_database

u64 = st.integers(0, 2**64 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
text = st.text(max_size=20)
optional_text = st.none() | text


@st.composite
def any_frame(draw: st.DrawFn) -> Frame:
    return Frame(
        seq_id=draw(u64),
        log_id=draw(u64),
        service=draw(i32),
        method=draw(i32),
        headers=tuple(draw(st.lists(st.tuples(text, text), max_size=5))),
        payload_encoding=draw(optional_text),
        payload_type=draw(optional_text),
        payload=draw(st.none() | st.binary(max_size=200)),
        log_id_new=draw(optional_text),
    )


def as_sdk(frame: Frame) -> SdkFrame:
    sdk = SdkFrame(SeqID=frame.seq_id, LogID=frame.log_id, service=frame.service)
    sdk.method = frame.method
    for key, value in frame.headers:
        h = sdk.headers.add()
        h.key, h.value = key, value
    for name, value in (
        ("payload_encoding", frame.payload_encoding),
        ("payload_type", frame.payload_type),
        ("payload", frame.payload),
        ("LogIDNew", frame.log_id_new),
    ):
        if value is not None:
            setattr(sdk, name, value)
    return sdk


@given(any_frame())
def test_our_bytes_are_the_sdks_bytes_both_ways(frame: Frame) -> None:
    sdk = as_sdk(frame)
    assert frame.encode() == sdk.SerializeToString()
    assert frames.decode(sdk.SerializeToString()) == frame
    parsed = SdkFrame()
    parsed.ParseFromString(frame.encode())
    assert parsed == sdk


@given(st.binary(max_size=300))
def test_any_bytes_decode_to_a_frame_or_a_frame_error(data: bytes) -> None:
    try:
        frame = frames.decode(data)
    except FrameError:
        return
    assert frames.decode(frame.encode()) == frame


def test_an_ack_echoes_the_frame_with_its_unknown_fields() -> None:
    sdk = as_sdk(Frame(seq_id=1, method=1, headers=(("type", "event"),), payload=b"{}"))
    data = sdk.SerializeToString() + b"\x50\x07"  # field 10 (varint 7): not in the proto
    frame = frames.decode(data)
    assert frame.unknown == ((10, 0, b"\x07"),)
    assert frame.encode() == data
    assert frame.with_headers(biz_rt="3").header("biz_rt") == "3"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "lacks its required SeqID"),
        (b"\x08", "ends inside a number"),
        (b"\x08\x01\x10\x01\x18\x01", "lacks its required method"),
        (b"\x0a\x01x", "wire type 2, not 0"),
        (b"\x42\x05ab", "runs past the end"),
        (b"\x08" + b"\xff" * 11, "over ten bytes"),
        (b"\x08\x01\x10\x01\x18\x01\x20\x01\x2a\x02\x0a\x00", "lacks its key or its value"),
        (b"\x08\x01\x10\x01\x18\x01\x20\x01\x32\x01\xff", "payload_encoding is not UTF-8"),
        (b"\x08\x01\x10\x01\x18\x80\x80\x80\x80\x10\x20\x01", "service is not a 32-bit"),
        (b"\x07", "numbered 0"),
        (b"\x0b", "wire type 3"),
    ],
)
def test_what_is_not_a_frame_says_why(data: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        frames.decode(data)
    with pytest.raises(FrameError, match="binary"):
        frames.decode("text")  # type: ignore[arg-type]
