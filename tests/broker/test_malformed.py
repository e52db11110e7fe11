"""Malformed frames against a live broker replica: the bad connection is closed (or, for a bad
header field, answered), and another client connection keeps being served meanwhile."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import trio

from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.frame import encode
from tests.broker.group import broker_group, send_request

CLOSE_TIMEOUT_S = 5.0


def frame(header: bytes, body: bytes = b"", serialization: int = 0) -> bytes:
    mark = (serialization << 24) | len(header)
    return struct.pack(">ii", 4 + len(header) + len(body), mark) + header + body


def json_header(**fields: object) -> bytes:
    base: dict[str, object] = {"code": 28, "language": "JAVA", "version": 401, "opaque": 1}
    base.update(fields)
    return json.dumps({**base, "flag": 0, "remark": "", "extFields": {}}).encode()


BAD_FRAMES = {
    "truncated": frame(json_header())[:-7],  # then the stream ends inside the frame
    "oversized length": struct.pack(">ii", (16 << 20) + 1, 0) + b"x" * 64,
    "length shorter than the header mark": struct.pack(">i", 2) + b"ab",
    "header length past the frame": struct.pack(">ii", 8, 100) + b"{}{}",
    "garbage JSON header": frame(b'{"code": 28, "opaque": '),
    "JSON header not an object": frame(b"[28, 1]"),
    "unknown serialization type": frame(json_header(), serialization=7),
    "wrong header field type": frame(json_header(code="twenty-eight")),
    "binary header that does not add up": frame(b"\x00\x1c\x00\x01\x91", serialization=1),
}


async def still_served(conn: Connection) -> None:
    answer = await conn.request(
        RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout_s=5
    )
    assert answer.code == ResponseCode.SUCCESS
    sent = await conn.request(send_request("MalformedTopic", b"ok"), timeout_s=10)
    assert sent.code == ResponseCode.SUCCESS, sent.remark


async def closed_by_peer(stream: trio.SocketStream) -> bytes:
    """Read until the broker closes the socket; what it sent before (nothing expected)."""
    got = b""
    with trio.fail_after(CLOSE_TIMEOUT_S):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:  # a reset counts as closed
                return got
            if not chunk:
                return got
            got += chunk


async def test_malformed_frames_close_only_their_connection(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        for broker in (group.leader(), group.follower()):
            port = broker.config.listen.port
            async with open_connection("127.0.0.1", port) as good:
                await still_served(good)
                for name, data in BAD_FRAMES.items():
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    async with stream:
                        await stream.send_all(data)
                        if name == "truncated":
                            await stream.send_eof()
                        assert await closed_by_peer(stream) == b"", name
                    await still_served(good)


async def test_bad_header_fields_are_answered_and_the_connection_kept(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        port = group.leader().config.listen.port
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            request = send_request("MalformedTopic", b"x")
            fields = dict(request.ext_fields)
            fields["queueId"] = "zero"
            bad = RemotingCommand(code=RequestCode.SEND_MESSAGE, opaque=7, ext_fields=fields)
            await stream.send_all(encode(bad))
            good = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO, opaque=8)
            await stream.send_all(encode(good))
            answers = {}
            buffer = b""
            with trio.fail_after(CLOSE_TIMEOUT_S):
                while len(answers) < 2:
                    buffer += await stream.receive_some(65536)
                    while len(buffer) >= 8:
                        (length,) = struct.unpack_from(">i", buffer)
                        if len(buffer) < 4 + length:
                            break
                        (mark,) = struct.unpack_from(">i", buffer, 4)
                        header = json.loads(buffer[8 : 8 + (mark & 0xFFFFFF)])
                        answers[header["opaque"]] = header
                        buffer = buffer[4 + length :]
        assert answers[7]["code"] == ResponseCode.SYSTEM_ERROR
        assert "queueId" in answers[7]["remark"]
        assert answers[8]["code"] == ResponseCode.SUCCESS
