"""`Broker`: what every request handler of one replica works with.

One object per replica, split by concern into the parts it holds: the node (Raft), the state
(what the log derives), the write path (local or forwarded), the client registry and the
offset coalescer. Handlers (send.py, pull.py, offsets.py, clients.py, admin.py, query.py) are
functions of (broker, request, connection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from broker.clients import ClientRegistry
from broker.config import BrokerConfig
from broker.disk import DiskGuard
from broker.metadata import DEFAULT_TOPIC, PERM_INHERIT, PERM_READ, PERM_WRITE, TopicConfig
from broker.offsets import OffsetCoalescer
from broker.state import BrokerState, Placed
from broker.writes import WritePath
from dledger.client import DLedgerClient
from dledger.node import Node
from dledger.raft.events import Role
from remoting import stored_message

if TYPE_CHECKING:
    from broker.registration import Registrar

# a forwarded write's reply says it committed; this replica normally learns that within one
# heartbeat of the leader. Asking the leader instead is the slow path (and may find a new one).
PLACEMENT_WAIT_S = 1.0


@attrs.define
class Broker:
    config: BrokerConfig
    node: Node
    state: BrokerState
    writes: WritePath
    client: DLedgerClient
    clients: ClientRegistry
    offsets: OffsetCoalescer
    started_ms: int = 0
    cold_read_bytes: int = 0  # read in for pulls behind the log's page-cache tail
    send_requests: int = 0  # send requests handled here (broker/send.py handle_sends)
    send_appends: int = 0  # the appends they were written in (several requests share one)
    disk: DiskGuard = attrs.field(
        default=attrs.Factory(
            lambda self: DiskGuard(self.config.store_root, self.config.disk_max_used_percent / 100),
            takes_self=True,
        )
    )
    background: trio.Nursery = attrs.field(init=False)  # tasks a handler leaves running
    registrar: Registrar = attrs.field(init=False)

    @property
    def store_host(self) -> tuple[str, int]:
        """The address clients reach this replica at (brokerIP1:listenPort)."""
        return self.config.broker_ip, self.config.listen.port

    @property
    def address(self) -> str:
        return f"{self.config.broker_ip}:{self.config.listen.port}"

    @property
    def is_leader(self) -> bool:
        return self.node.role.role is Role.LEADER

    def topic(self, name: str) -> TopicConfig | None:
        """A topic's config; TBW102, the auto-creation template, is always known."""
        config = self.state.metadata.topics.get(name)
        if config is None and name == DEFAULT_TOPIC:
            inherit = PERM_INHERIT if self.config.auto_create_topic else 0
            return TopicConfig(DEFAULT_TOPIC, 8, 8, PERM_READ | PERM_WRITE | inherit)
        return config

    def all_topics(self) -> dict[str, TopicConfig]:
        topics = dict(self.state.metadata.topics)
        default = self.topic(DEFAULT_TOPIC)
        assert default is not None
        topics.setdefault(DEFAULT_TOPIC, default)
        return topics

    async def placements(self, first: int, last: int, *, shaped_here: bool) -> list[Placed]:
        """Where the committed messages first..last landed (queue and physical offsets).
        `shaped_here`: this replica committed them as leader (see BrokerState.placed_range)."""
        known = self.state.placed_range(first, last, shaped_here=shaped_here)
        if None not in known:
            return known  # type: ignore[return-value]  # no None in it
        placed: list[Placed] = []
        for index, p in enumerate(known, first):
            placed.append(p if p is not None else await self._read_placement(index))
        return placed

    async def _read_placement(self, index: int) -> Placed:
        """From this replica's log once it knows the entry committed: the leader said so, and
        a follower learns it with the leader's next message. Only if that takes longer than
        PLACEMENT_WAIT_S is the leader asked, and a leader elected meanwhile may not have
        committed the index yet (it answers INDEX_OUT_OF_RANGE: `dledger.client.ClientError`)."""
        node = self.node
        with trio.move_on_after(PLACEMENT_WAIT_S):
            await self.state.wait_applied(index)
        if index <= node.commit_index and index <= node.last_index:
            body = node.entry(index).body
        else:
            entries = await self.client.get(index)
            body = entries[0].body
        fields = stored_message.read_dispatch(body)
        return Placed(fields.queue_id, fields.queue_offset, fields.physical_offset)
