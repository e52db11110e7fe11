"""The usual frame decoded in C (remoting/frame_native.c) against the Python decoder, which
defines it: for arbitrary streams of frames, usual and not (headers with fields missing, null,
of other types or out of range, numbers and nulls among extFields, too many of them, a header
that is no JSON object, binary headers, lengths that lie or exceed the bound), fed in arbitrary
pieces, FrameDecoder yields the same commands with the C half as without it, then raises the
same error or waits for the same number of bytes."""

from __future__ import annotations

import itertools
import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from remoting import frame as frame_module
from remoting import limits
from remoting.codes import SerializeType
from remoting.command import RemotingCommand
from remoting.errors import FrameError
from remoting.frame import FrameDecoder, encode

assert frame_module.native is not None, (
    "remoting._frame_native is not built: run ./dev.sh test (pip install -e .)"
)

INT32_EDGES = [0, 1, -1, 10, 310, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**40]
VALUES = st.one_of(
    st.sampled_from(INT32_EDGES),
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.just(1.5),
    st.just([1]),
    st.just({"x": "y"}),
)
EXT_VALUES = st.one_of(st.text(max_size=8), st.integers(-5, 5), st.none(), st.booleans())
FIELD_NAMES = ["code", "opaque", "flag", "version", "remark", "language", "extFields"]


@st.composite
def json_headers(draw: st.DrawFn) -> bytes:
    header: dict[str, Any] = {
        "code": draw(st.sampled_from([10, 310, 0])),
        "language": "JAVA",
        "version": 401,
        "opaque": draw(st.integers(0, 2**31 - 1)),
        "flag": 0,
        "remark": "",
        "extFields": draw(st.dictionaries(st.text(max_size=5), st.text(max_size=8), max_size=5)),
    }
    for name in draw(st.lists(st.sampled_from(FIELD_NAMES), max_size=2)):  # unusual fields
        if draw(st.booleans()):
            header.pop(name, None)
        elif name == "extFields":
            header[name] = draw(
                st.one_of(
                    st.dictionaries(st.text(max_size=3), EXT_VALUES, max_size=4),
                    st.just({f"k{n}": "v" for n in range(limits.EXT_FIELDS_MAX + 1)}),
                    VALUES,
                )
            )
        else:
            header[name] = draw(VALUES)
    shape = draw(st.sampled_from(["object"] * 6 + ["list", "broken", "newline"]))
    text = json.dumps(header, separators=(",", ":")).encode()
    if shape == "list":
        return json.dumps([header]).encode()
    if shape == "broken":
        return text[: max(1, len(text) // 2)]
    if shape == "newline":  # the C++ client ends its header with one
        return text + b"\n"
    return text


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["json"] * 8 + ["binary", "lying", "huge", "tiny"]))
    body = draw(st.binary(max_size=40))
    if kind == "binary":
        command = RemotingCommand.request(10, {"a": "1"}, body).with_opaque(draw(st.integers(0, 9)))
        return encode(command._replace(serialization=SerializeType.ROCKETMQ))
    if kind == "lying":  # a header length past the frame
        return struct.pack(">II", 4 + len(body), 0 << 24 | (len(body) + 5)) + body
    if kind == "huge":
        return struct.pack(">II", limits.FRAME_BYTES_MAX + 1, 0)
    if kind == "tiny":
        return struct.pack(">I", draw(st.integers(0, 3)))
    header = draw(json_headers())
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


def decode(pieces: list[bytes], monkeypatch: pytest.MonkeyPatch, native: bool) -> tuple:
    """What a decoder fed `pieces` yields after each: commands, then an error or the bytes it
    waits on."""
    with monkeypatch.context() as patch:
        if not native:
            patch.setattr(frame_module, "native", None)
        decoder = FrameDecoder(limits.FRAME_BYTES_MAX)
        seen: list[object] = []
        for piece in pieces:
            decoder.feed(piece)
            try:
                seen.append(list(decoder.commands()))
            except FrameError as err:
                seen.append((type(err), str(err)))
                break
        seen.append(decoder.buffered)
    return tuple(seen)


@settings(max_examples=500, suppress_health_check=list(HealthCheck))
@given(stream=st.lists(frames(), min_size=1, max_size=5), cuts=st.lists(st.integers(0, 400)))
def test_c_and_python_decode_any_stream_alike(
    stream: list[bytes], cuts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"".join(stream)
    points = sorted({c for c in cuts if c < len(data)} | {0, len(data)})
    pieces = [data[a:b] for a, b in itertools.pairwise(points)] or [data]
    with_c = decode(pieces, monkeypatch, native=True)
    event(f"{sum(len(s) for s in with_c if isinstance(s, list))} commands")
    assert with_c == decode(pieces, monkeypatch, native=False)


def test_the_usual_frame_is_decoded_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    command = RemotingCommand.request(10, {"topic": "T", "queueId": "1"}, b"body").with_opaque(7)
    calls: list[int] = []
    real = frame_module.native
    assert real is not None

    class Counting:
        @staticmethod
        def json_frames(*args: Any) -> tuple[list[RemotingCommand], int]:
            decoded, start = real.json_frames(*args)
            calls.append(len(decoded))
            return decoded, start

    monkeypatch.setattr(frame_module, "native", Counting)
    decoder = FrameDecoder()
    decoder.feed(encode(command) * 3)
    assert list(decoder.commands()) == [command] * 3
    assert calls[0] == 3  # all three in the first call, none left to Python
    assert decoder.buffered == 0
