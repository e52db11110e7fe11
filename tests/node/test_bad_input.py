"""What a bad peer, client or command line gets: a clear refusal, and the node keeps serving."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from dledger import limits
from dledger.client import open_client
from dledger.config import ConfigError
from dledger.localgroup import LocalGroup, free_port, wait_until
from dledger.log.config import FlushPolicy
from dledger.server import build_parser, config_from_args
from dledger.wire import LENGTH, Code, FrameReader, Status, encode_frame
from tests.node.conftest import wait_for_leader


def exchange(
    group: LocalGroup, node: str, data: bytes, *, replies: int | None = None
) -> list[dict[str, Any]]:
    """Send raw bytes, return the frames received until the server closes the connection, or,
    for a connection the server keeps, until `replies` frames came; 5 s is the deadline."""
    address = group.peers[node]
    with socket.create_connection((address.host, address.port), timeout=5) as s:
        s.sendall(data)
        reader = FrameReader()
        frames: list[dict[str, Any]] = []
        try:
            while (replies is None or len(frames) < replies) and (chunk := s.recv(65536)):
                reader.feed(chunk)
                frames.extend(reader.frames())
        except TimeoutError:
            pass
        return frames


def still_serves(group: LocalGroup) -> None:
    async def check() -> None:
        async with open_client(group.peers) as client:
            await wait_for_leader(client)
            assert await client.append(b"still here") >= 1

    trio.run(check)


def hello(g: LocalGroup, **override: object) -> bytes:
    body = {
        "c": Code.HELLO,
        "group": g.group,
        "from": "n1",
        "to": "n0",
        "segment_bytes": 1 << 20,
        **override,
    }
    return encode_frame(body)


class TestFrames:
    def test_garbage_gets_malformed_and_a_closed_connection(self, shared_group: LocalGroup) -> None:
        (reply,) = exchange(shared_group, "n0", LENGTH.pack(4) + b"\xc1\xc1\xc1\xc1")
        assert reply["status"] == Status.MALFORMED and "not msgpack" in reply["msg"]
        still_serves(shared_group)

    def test_oversized_frame_is_refused_from_its_length(self, shared_group: LocalGroup) -> None:
        (reply,) = exchange(
            shared_group, "n0", LENGTH.pack(limits.FRAME_BYTES_MAX + 1) + b"x" * 100
        )
        assert reply["status"] == Status.FRAME_TOO_LARGE
        assert str(limits.FRAME_BYTES_MAX) in reply["msg"]
        still_serves(shared_group)

    def test_not_a_map(self, shared_group: LocalGroup) -> None:
        payload = msgpack.packb("hello")
        (reply,) = exchange(shared_group, "n0", LENGTH.pack(len(payload)) + payload)
        assert reply["status"] == Status.MALFORMED and "expected a map" in reply["msg"]


class TestPeers:
    @pytest.mark.parametrize(
        ("override", "words"),
        [
            ({"group": "other"}, "of group 'other'"),
            ({"from": "n9"}, "'n9' is not a peer"),
            ({"to": "n2"}, "wanted 'n2'"),
            ({"segment_bytes": 4096}, "positions would differ"),
        ],
    )
    def test_wrong_hello_is_refused_and_logged(
        self, shared_group: LocalGroup, override: dict[str, object], words: str
    ) -> None:
        (reply,) = exchange(shared_group, "n0", hello(shared_group, **override))
        assert reply["status"] == Status.WRONG_PEER and words in reply["msg"]
        wait_until(lambda: words in shared_group.log_text("n0"), 5, what="refusal in the log")
        still_serves(shared_group)

    def test_malformed_raft_message_from_a_peer_closes_only_that_connection(
        self, shared_group: LocalGroup
    ) -> None:
        bad = encode_frame({"c": Code.HEARTBEAT, "from": "n1", "term": "x", "commit": 0})
        (reply,) = exchange(shared_group, "n0", hello(shared_group) + bad)
        assert reply["status"] == Status.MALFORMED and "field 'term' must be int" in reply["msg"]
        still_serves(shared_group)

    def test_peer_cannot_impersonate(self, shared_group: LocalGroup) -> None:
        bad = encode_frame({"c": Code.HEARTBEAT_REPLY, "from": "n2", "term": 1})
        (reply,) = exchange(shared_group, "n0", hello(shared_group) + bad)
        assert "on the connection of 'n1'" in reply["msg"]


class TestClients:
    def request(self, shared_group: LocalGroup, node: str, **body: object) -> dict[str, Any]:
        (reply,) = exchange(shared_group, node, encode_frame({"id": 7, **body}), replies=1)
        assert reply["id"] == 7
        return reply

    def test_entry_over_the_limit_is_refused_and_nothing_stored(
        self, shared_group: LocalGroup
    ) -> None:
        async def run() -> None:
            async with open_client(shared_group.peers) as client:
                leader = await wait_for_leader(client)
                before = (await client.status(leader))["last_index"]
                from dledger.client import AppendFailed

                with pytest.raises(AppendFailed) as err:
                    await client.append(b"x" * (limits.ENTRY_BODY_BYTES_MAX + 1))
                assert err.value.status is Status.ENTRY_TOO_LARGE
                assert (await client.status(leader))["last_index"] == before
                await client.append(b"fine")

        trio.run(run)

    def test_read_beyond_the_end(self, shared_group: LocalGroup) -> None:
        reply = self.request(shared_group, "n0", c=Code.GET, index=10**9)
        assert (
            reply["status"] == Status.INDEX_OUT_OF_RANGE and "is not committed here" in reply["msg"]
        )

    def test_bad_count(self, shared_group: LocalGroup) -> None:
        reply = self.request(shared_group, "n0", c=Code.GET, index=1, count=0)
        assert reply["status"] == Status.BAD_REQUEST

    def test_unknown_request_code_is_answered_and_the_connection_kept(
        self, shared_group: LocalGroup
    ) -> None:
        frames = exchange(
            shared_group,
            "n0",
            encode_frame({"c": 999, "id": 7}) + encode_frame({"c": Code.STATUS, "id": 8}),
            replies=2,
        )
        assert frames[0]["id"] == 7 and frames[0]["status"] == Status.BAD_REQUEST
        assert "unknown request code 999" in frames[0]["msg"]
        assert frames[1]["id"] == 8 and frames[1]["status"] == Status.OK

    def test_append_with_no_bodies(self, shared_group: LocalGroup) -> None:
        reply = self.request(shared_group, "n0", c=Code.APPEND, bodies=[])
        assert reply["status"] == Status.BAD_REQUEST


def run_cli(*args: str, module: str = "dledger.server") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60
    )


class TestCommandLine:
    @pytest.mark.parametrize(
        ("peers", "self_id", "words"),
        [
            ("n0-127.0.0.1:1;n1-127.0.0.1:2", "n7", "--self-id 'n7' is not in --peers"),
            ("n0:127.0.0.1:1", "n0", "must be id-host:port"),
            ("n0-127.0.0.1:99999", "n0", "port must be 1-65535"),
            ("n0-127.0.0.1:1;n0-127.0.0.1:2", "n0", "appears twice"),
            ("n0-127.0.0.1:1;n1-127.0.0.1:1", "n0", "share address"),
            ("", "n0", "--peers is empty"),
        ],
    )
    def test_bad_peers_exit_2_with_the_reason(
        self, tmp_path: Path, peers: str, self_id: str, words: str
    ) -> None:
        p = run_cli(
            "--group", "g", "--self-id", self_id, "--peers", peers, "--store", str(tmp_path)
        )
        assert p.returncode == 2
        assert words in p.stderr

    def test_bad_timeouts(self, tmp_path: Path) -> None:
        p = run_cli(
            "--group", "g", "--self-id", "n0", "--peers", "n0-127.0.0.1:1",
            "--store", str(tmp_path), "--heartbeat-ms", "400",
        )  # fmt: skip
        assert p.returncode == 2 and "must exceed two heartbeats" in p.stderr

    def test_flush_flags_reach_the_store(self, tmp_path: Path) -> None:
        base = ["--group", "g", "--self-id", "n0", "--peers", "n0-127.0.0.1:1"]
        base += ["--store", str(tmp_path), "--flush", "ASYNC_FLUSH"]
        default = config_from_args(build_parser().parse_args(base)).store
        assert not default.flush_timed
        assert default.flush_least_pages == limits.FLUSH_LEAST_PAGES_DEFAULT
        args = build_parser().parse_args([*base, "--flush-timed", "--flush-least-pages", "4"])
        store = config_from_args(args).store
        assert store.flush is FlushPolicy.ASYNC_FLUSH
        assert store.flush_timed and store.flush_least_pages == 4
        assert default.cache_tail_bytes == limits.CACHE_TAIL_BYTES_DEFAULT
        args = build_parser().parse_args([*base, "--cache-tail-bytes", "0"])
        assert config_from_args(args).store.cache_tail_bytes == 0
        with pytest.raises(ConfigError, match="cache_tail_bytes must be at least 0"):
            config_from_args(build_parser().parse_args([*base, "--cache-tail-bytes", "-1"]))

    def test_port_in_use_exits_1(self, tmp_path: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            p = run_cli(
                "--group",
                "g",
                "--self-id",
                "n0",
                "--peers",
                f"n0-127.0.0.1:{port}",
                "--store",
                str(tmp_path),
            )
        assert p.returncode == 1
        assert "address already in use" in p.stderr.lower()

    def test_store_of_another_group_exits_1(self, tmp_path: Path) -> None:
        port = free_port()
        group = LocalGroup(tmp_path, group="a", nodes=1, ports=[port])
        group.start_all()
        wait_until(lambda: (tmp_path / "a" / "n0" / "dledger" / "meta").exists(), 10, what="store")
        group.stop_all()
        p = run_cli(
            "--group", "b", "--self-id", "n0", "--peers", f"n0-127.0.0.1:{port}",
            "--store", str(tmp_path / "a" / "n0"),
        )  # fmt: skip
        assert p.returncode == 1 and "cannot open store" in p.stderr and "group" in p.stderr

    def test_client_bad_peers(self) -> None:
        p = run_cli("--peers", "nonsense", "status", module="dledger.cli")
        assert p.returncode == 2 and "must be id-host:port" in p.stderr

    def test_client_against_nothing_fails_cleanly(self) -> None:
        p = run_cli(
            "--peers",
            f"n0-127.0.0.1:{free_port()}",
            "--timeout",
            "1",
            "append",
            "x",
            module="dledger.cli",
        )
        assert p.returncode in (1, 3)
        assert "Traceback" not in p.stderr
