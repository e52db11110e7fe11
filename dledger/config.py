"""A node's configuration: DLedger's peers string, timeouts in milliseconds, the store.

Everything a user can get wrong is checked here, with a message that names the value, so that
`dledger-server` fails at start-up rather than misbehaving later.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from dledger import limits
from dledger.log.store import FlushPolicy, StoreConfig
from dledger.raft.config import RaftConfig

NODE_ID = re.compile(r"^[A-Za-z0-9_]{1,64}$")
GROUP = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class ConfigError(ValueError):
    """A configuration a node cannot start with; the message says what to fix."""


@attrs.frozen
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Address:
        host, sep, port = text.strip().rpartition(":")
        if not sep or not host:
            raise ConfigError(f"address {text!r} must be host:port")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"address {text!r}: port must be 1-65535")
        return cls(host, int(port))


def parse_peers(text: str) -> dict[str, Address]:
    """DLedger's form: "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"."""
    peers: dict[str, Address] = {}
    parts = [p for p in (part.strip() for part in text.split(";")) if p]
    if not parts:
        raise ConfigError("--peers is empty; expected id-host:port;id-host:port;...")
    for part in parts:
        node_id, sep, address = part.partition("-")
        if not sep:
            raise ConfigError(f"peer {part!r} must be id-host:port, e.g. n0-127.0.0.1:40911")
        if not NODE_ID.match(node_id):
            raise ConfigError(f"peer id {node_id!r} must be 1-64 letters, digits or '_'")
        if node_id in peers:
            raise ConfigError(f"peer id {node_id!r} appears twice in --peers")
        peers[node_id] = Address.parse(address)
    seen: dict[Address, str] = {}
    for node_id, peer_address in peers.items():
        if peer_address in seen:
            raise ConfigError(
                f"peers {seen[peer_address]} and {node_id} share address {peer_address}"
            )
        seen[peer_address] = node_id
    return peers


def format_peers(peers: dict[str, Address]) -> str:
    return ";".join(f"{node_id}-{address}" for node_id, address in peers.items())


@attrs.frozen
class NodeConfig:
    group: str
    self_id: str
    peers: dict[str, Address]
    store_dir: Path
    tick_ms: int = limits.TICK_MS_DEFAULT
    raft: RaftConfig = attrs.field(factory=RaftConfig)
    store: StoreConfig = attrs.field(factory=StoreConfig)
    checkpoint_interval_ms: int = limits.CHECKPOINT_INTERVAL_MS_DEFAULT
    file_reserved_hours: float = 72.0  # RocketMQ's fileReservedTime default
    delete_when_hour: int | None = 4  # RocketMQ's deleteWhen default: "04"
    disk_max_used_ratio: float = 0.75  # RocketMQ's diskMaxUsedSpaceRatio default (75)
    append_timeout_ms: int = limits.APPEND_TIMEOUT_MS_DEFAULT

    @property
    def peer_unacked_timeout_ms(self) -> int:
        """A peer connection whose data stays unacknowledged this long is dropped and re-made:
        the shortest election timeout, so a link across a healed partition comes back about
        as fast as an election would."""
        return self.raft.election_ticks_min * self.tick_ms

    def __attrs_post_init__(self) -> None:
        if not GROUP.match(self.group):
            raise ConfigError(f"group {self.group!r} must be 1-128 letters, digits, '_', '.', '-'")
        if self.self_id not in self.peers:
            known = ", ".join(self.peers) or "none"
            raise ConfigError(f"--self-id {self.self_id!r} is not in --peers (peers: {known})")
        if self.tick_ms < 1:
            raise ConfigError("tick must be >= 1 ms")
        if self.raft.preferred_leader is not None and self.raft.preferred_leader not in self.peers:
            raise ConfigError(f"preferred leader {self.raft.preferred_leader!r} is not in --peers")
        if not 0 < self.disk_max_used_ratio <= 1:
            raise ConfigError("disk max used ratio must be in (0, 1]")
        if self.delete_when_hour is not None and not 0 <= self.delete_when_hour < 24:
            raise ConfigError("deleteWhen hour must be 0-23")

    @property
    def listen(self) -> Address:
        return self.peers[self.self_id]

    @property
    def flush(self) -> FlushPolicy:
        return self.store.flush


def raft_config_from_ms(
    tick_ms: int,
    heartbeat_ms: int,
    election_ms_min: int,
    election_ms_max: int,
    preferred_leader: str | None,
) -> RaftConfig:
    """Timeouts in milliseconds to ticks, with the relations RaftConfig enforces."""

    def ticks(ms: int, name: str) -> int:
        if ms < tick_ms or ms % tick_ms:
            raise ConfigError(
                f"{name} ({ms} ms) must be a positive multiple of the tick ({tick_ms} ms)"
            )
        return ms // tick_ms

    try:
        return RaftConfig(
            heartbeat_ticks=ticks(heartbeat_ms, "heartbeat"),
            election_ticks_min=ticks(election_ms_min, "election timeout min"),
            election_ticks_max=ticks(election_ms_max, "election timeout max"),
            preferred_leader=preferred_leader,
            leader_lost_stagger_ticks=max(
                1, limits.LEADER_LOST_STAGGER_TICKS * limits.TICK_MS_DEFAULT // tick_ms
            ),
            transfer_ticks_max=max(1, election_ms_min // tick_ms),
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err
