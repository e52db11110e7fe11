"""The frame codec: round trips of both header forms, and every corruption's named error."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remoting import limits
from remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, LanguageCode, ResponseCode, SerializeType
from remoting.errors import FrameTooLarge, MalformedFrame
from remoting.frame import FrameDecoder, RemotingCommand, encode

int16 = st.integers(-(1 << 15), (1 << 15) - 1)
int32 = st.integers(-(1 << 31), (1 << 31) - 1)
texts = st.text(max_size=40)


@st.composite
def commands(draw: st.DrawFn, serialization: SerializeType) -> RemotingCommand:
    return RemotingCommand(
        code=draw(int16 if serialization is SerializeType.ROCKETMQ else int32),
        language=draw(st.sampled_from([c.name for c in LanguageCode])),
        version=draw(int16 if serialization is SerializeType.ROCKETMQ else int32),
        opaque=draw(int32),
        flag=draw(int32),
        remark=draw(texts),
        ext_fields=draw(st.dictionaries(texts, texts, max_size=8)),
        body=draw(st.binary(max_size=300)),
        serialization=serialization,
    )


def decode_all(data: bytes) -> list[RemotingCommand]:
    decoder = FrameDecoder()
    decoder.feed(data)
    out = list(decoder.commands())
    decoder.check_closed()
    return out


def frame(header: bytes, body: bytes = b"", serialization: int = 0) -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), serialization << 24 | len(header)) + (
        header + body
    )


class TestRoundTrip:
    @given(commands(SerializeType.JSON))
    def test_json_header(self, command: RemotingCommand) -> None:
        """A JSON-header command decodes to itself."""
        assert decode_all(encode(command)) == [command]

    @given(commands(SerializeType.JSON))
    def test_json_header_bytes_are_the_json_modules(self, command: RemotingCommand) -> None:
        """The header is written by orjson; its bytes are what json.dumps writes compactly
        (what Java and C++ clients have always read from us)."""
        header = {
            "code": command.code,
            "language": command.language,
            "version": command.version,
            "opaque": command.opaque,
            "flag": command.flag,
            "remark": command.remark,
            "extFields": dict(command.ext_fields),
        }
        expected = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
        assert encode(command)[8 : 8 + len(expected)] == expected
        assert len(encode(command)) == 8 + len(expected) + len(command.body)

    @given(commands(SerializeType.ROCKETMQ))
    def test_binary_header(self, command: RemotingCommand) -> None:
        """A binary-header command decodes to itself."""
        assert decode_all(encode(command)) == [command]

    @given(
        st.lists(commands(SerializeType.JSON) | commands(SerializeType.ROCKETMQ), max_size=5),
        st.integers(1, 50),
    )
    def test_split_anywhere(self, sent: list[RemotingCommand], chunk: int) -> None:
        """Commands fed in arbitrary pieces come out whole and in order."""
        data = b"".join(encode(c) for c in sent)
        decoder = FrameDecoder()
        got: list[RemotingCommand] = []
        for i in range(0, len(data), chunk):
            decoder.feed(data[i : i + chunk])
            got += decoder.commands()
        assert got == sent
        assert decoder.buffered == 0

    def test_layout(self) -> None:
        """The bytes match the table in remoting/frame.py: length, mark, header, body."""
        command = RemotingCommand(code=10, opaque=7, body=b"xy", serialization=SerializeType.JSON)
        data = encode(command)
        length, mark = struct.unpack_from(">II", data)
        assert length == len(data) - 4
        assert mark >> 24 == 0
        header = json.loads(data[8 : 8 + (mark & 0xFFFFFF)])
        assert header["code"] == 10 and header["opaque"] == 7 and header["extFields"] == {}
        assert data.endswith(b"xy")

    def test_binary_layout(self) -> None:
        """The binary header: code, language, version, opaque, flag, remark, ext."""
        command = RemotingCommand(
            code=105,
            language="JAVA",
            version=401,
            opaque=3,
            flag=0,
            remark="r",
            ext_fields={"topic": "T"},
            serialization=SerializeType.ROCKETMQ,
        )
        data = encode(command)
        assert data[4] == 1
        header = data[8:]
        assert header == (
            struct.pack(">hbhii", 105, 0, 401, 3, 0)
            + struct.pack(">i", 1)
            + b"r"
            + struct.pack(">i", 2 + 5 + 4 + 1)
            + struct.pack(">h", 5)
            + b"topic"
            + struct.pack(">i", 1)
            + b"T"
        )


class TestWhatClientsSend:
    def test_cpp_json_with_newline_and_numbers(self) -> None:
        """C++ ends its header with a newline and sends some extFields as numbers."""
        header = (
            b'{"code":11,"extFields":{"queueId":3,"topic":"T","commitOffset":-1,"big":2.0,'
            b'"flag":true,"gone":null},"flag":0,"language":"CPP","opaque":5,"remark":"",'
            b'"version":63}\n'
        )
        (command,) = decode_all(frame(header))
        assert command.ext_fields == {
            "queueId": "3",
            "topic": "T",
            "commitOffset": "-1",
            "big": "2",
            "flag": "true",
        }
        assert command.language == "CPP" and command.version == 63 and command.opaque == 5

    def test_java_omits_nulls(self) -> None:
        """Java leaves out a null remark and null extFields."""
        (command,) = decode_all(frame(b'{"code":0,"opaque":1,"flag":1,"language":"JAVA"}'))
        assert command.remark == "" and command.ext_fields == {} and command.is_response

    def test_answer_in_request_serialization(self) -> None:
        """A response keeps the request's opaque and serialization and sets the response bit."""
        request = RemotingCommand(code=105, opaque=9, serialization=SerializeType.ROCKETMQ)
        response = request.response(ResponseCode.TOPIC_NOT_EXIST, "no")
        assert response.opaque == 9 and response.serialization is SerializeType.ROCKETMQ
        assert response.flag == FLAG_RESPONSE and response.is_response
        assert encode(response)[4] == SerializeType.ROCKETMQ

    def test_flag_bits(self) -> None:
        assert RemotingCommand.request(10, oneway=True).flag == FLAG_ONEWAY
        assert RemotingCommand.request(10, oneway=True).is_oneway
        assert not RemotingCommand(code=10, flag=0).is_oneway  # C++'s "one-way" sends


class TestCorruption:
    def test_oversized_length(self) -> None:
        """A length past FRAME_BYTES_MAX is refused from the first 4 bytes."""
        decoder = FrameDecoder()
        decoder.feed(struct.pack(">I", limits.FRAME_BYTES_MAX + 1))
        with pytest.raises(FrameTooLarge) as err:
            decoder.next_command()
        assert err.value.length == limits.FRAME_BYTES_MAX + 1
        assert err.value.limit == limits.FRAME_BYTES_MAX

    def test_lying_length_all_ones(self) -> None:
        decoder = FrameDecoder()
        decoder.feed(b"\xff\xff\xff\xff")
        with pytest.raises(FrameTooLarge):
            decoder.next_command()
        with pytest.raises(FrameTooLarge):  # and it stays broken
            decoder.next_command()

    def test_length_too_short_for_mark(self) -> None:
        with pytest.raises(MalformedFrame, match="no room for the header mark"):
            decode_all(struct.pack(">I", 2) + b"\0\0")

    def test_truncated(self) -> None:
        """A stream that ends inside a frame is malformed, wherever it ends."""
        data = encode(RemotingCommand(code=10, ext_fields={"a": "b"}, body=b"body"))
        for cut in range(1, len(data)):
            decoder = FrameDecoder()
            decoder.feed(data[:cut])
            assert decoder.next_command() is None
            with pytest.raises(MalformedFrame, match="ended inside a frame"):
                decoder.check_closed()

    def test_garbage_json(self) -> None:
        with pytest.raises(MalformedFrame, match="not JSON"):
            decode_all(frame(b'{"code":10,'))

    def test_json_not_an_object(self) -> None:
        with pytest.raises(MalformedFrame, match="not an object"):
            decode_all(frame(b"[1,2]"))

    @pytest.mark.parametrize(
        ("header", "reason"),
        [
            (b'{"opaque":1}', "code must be"),
            (b'{"code":"10","opaque":1}', "code must be"),
            (b'{"code":1,"opaque":4294967296}', "opaque must be"),
            (b'{"code":1,"opaque":1,"remark":5}', "remark is a int"),
            (b'{"code":1,"opaque":1,"extFields":[]}', "extFields is a list"),
            (b'{"code":1,"opaque":1,"extFields":{"a":{"b":1}}}', "not a scalar"),
        ],
    )
    def test_wrong_json_types(self, header: bytes, reason: str) -> None:
        with pytest.raises(MalformedFrame, match=reason):
            decode_all(frame(header))

    def test_unknown_serialization(self) -> None:
        with pytest.raises(MalformedFrame, match="unknown serialization type 2"):
            decode_all(frame(b"{}", serialization=2))

    def test_header_length_past_frame(self) -> None:
        bad = struct.pack(">II", 4 + 2, 900) + b"{}"
        with pytest.raises(MalformedFrame, match="header length 900 runs past the frame"):
            decode_all(bad)

    def test_header_length_checked_before_body_arrives(self) -> None:
        """The header length is judged from the first 8 bytes, before the frame is buffered."""
        decoder = FrameDecoder()
        decoder.feed(struct.pack(">II", 1000, 2000))
        with pytest.raises(MalformedFrame, match="runs past the frame"):
            decoder.next_command()

    def test_binary_header_cut_short(self) -> None:
        with pytest.raises(MalformedFrame, match="shorter than 21"):
            decode_all(frame(b"\0" * 10, serialization=1))

    def test_binary_remark_past_header(self) -> None:
        header = struct.pack(">hbhii", 1, 0, 1, 1, 0) + struct.pack(">i", 99) + b"\0\0\0\0"
        with pytest.raises(MalformedFrame, match="remark of 99 bytes runs past"):
            decode_all(frame(header, serialization=1))

    def test_binary_ext_length_wrong(self) -> None:
        header = struct.pack(">hbhiii", 1, 0, 1, 1, 0, 0) + struct.pack(">i", 5) + b"\0\0"
        with pytest.raises(MalformedFrame, match="does not end the binary header"):
            decode_all(frame(header, serialization=1))

    def test_binary_unknown_language(self) -> None:
        header = struct.pack(">hbhiii", 1, 99, 1, 1, 0, 0) + struct.pack(">i", 0)
        with pytest.raises(MalformedFrame, match="unknown language code 99"):
            decode_all(frame(header, serialization=1))

    @given(st.binary(max_size=200))
    def test_random_bytes_never_crash(self, data: bytes) -> None:
        """Garbage gives commands, a wait for more, or a FrameError; nothing else."""
        decoder = FrameDecoder(frame_bytes_max=4096)
        decoder.feed(data)
        with contextlib.suppress(MalformedFrame, FrameTooLarge):
            list(decoder.commands())
