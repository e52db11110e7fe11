"""What the admin API (client/admin.py) returns, and the readers of the answers it comes from.

Each answer body is read with `remoting.fastjson.loads`, so both our broker's and a Java
broker's or name server's bodies are understood: fastjson writes maps keyed by a MessageQueue
with objects as keys (TopicStatsTable, ConsumeStats) and maps keyed by a number with bare
numeric keys (a BrokerData's brokerAddrs); docs/protocol.md shows the shapes. A body that does
not have the expected shape raises `BadAnswer`, which names the answer and what was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from client.errors import MQClientError
from client.message import MessageExt, MessageQueue
from client.route import BrokerData
from remoting import fastjson


@attrs.define
class BadAnswer(MQClientError):
    """An answer whose body is not what its request code promises."""

    what: str  # "ClusterInfo from 127.0.0.1:9876"
    reason: str

    def __str__(self) -> str:
        return f"unreadable {self.what}: {self.reason}"


@attrs.define
class BrokerFailure(MQClientError):
    """An operation that goes to several brokers (or name servers) failed on some of them;
    `done` lists where it succeeded, `failures` what each failed one said."""

    what: str  # "create topic T"
    done: list[str]
    failures: list[str]

    def __str__(self) -> str:
        done = f" (done on {', '.join(self.done)})" if self.done else ""
        return f"{self.what} failed on " + "; ".join(self.failures) + done


# --- name server ---------------------------------------------------------------------------------


@attrs.frozen
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO: every broker group a name server knows, by cluster."""

    brokers: Mapping[str, BrokerData]  # broker name -> its addresses by brokerId
    clusters: Mapping[str, tuple[str, ...]]  # cluster name -> broker names

    def groups_of(self, cluster: str) -> list[BrokerData]:
        """The broker groups of `cluster`, by name; MQClientError naming the known clusters
        when there is no such cluster."""
        names = self.clusters.get(cluster)
        if names is None:
            known = ", ".join(sorted(self.clusters)) or "none"
            raise MQClientError(f"no cluster {cluster!r} at the name servers (clusters: {known})")
        return [self.brokers[n] for n in sorted(names) if n in self.brokers]

    def group_at(self, address: str) -> BrokerData | None:
        """The group one of whose replicas registered `address`."""
        for data in self.brokers.values():
            if address in data.broker_addrs.values():
                return data
        return None


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{what} is not an integer: {value!r:.40}")
    return int(value)


def _object(body: bytes, what: str) -> dict[str, Any]:
    try:
        data = fastjson.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadAnswer(what, f"not JSON ({err})") from None
    if not isinstance(data, dict):
        raise BadAnswer(what, "not a JSON object")
    return data


def parse_cluster_info(body: bytes, what: str) -> ClusterInfo:
    data = _object(body, what)
    try:
        brokers = {}
        for name, b in (data.get("brokerAddrTable") or {}).items():
            addrs = {_int(k, "brokerId"): str(v) for k, v in (b.get("brokerAddrs") or {}).items()}
            brokers[str(name)] = BrokerData(str(b.get("cluster", "")), str(name), addrs)
        clusters = {
            str(c): tuple(sorted(str(n) for n in names))
            for c, names in (data.get("clusterAddrTable") or {}).items()
        }
    except (AttributeError, TypeError, ValueError) as err:
        raise BadAnswer(what, str(err)) from None
    return ClusterInfo(brokers, clusters)


def parse_topic_list(body: bytes, what: str) -> list[str]:
    topics = _object(body, what).get("topicList")
    if not isinstance(topics, list):
        raise BadAnswer(what, "topicList is not a list")
    return sorted(str(t) for t in topics)


@attrs.frozen
class ClusterMember:
    """One replica in clusterList: where the name servers see it, and what it says of itself
    (its GET_BROKER_RUNTIME_INFO table, empty with `error` set when it did not answer)."""

    cluster: str
    broker_name: str
    broker_id: int  # 0: the master (our group's Raft leader)
    address: str
    runtime: Mapping[str, str]
    error: str | None = None


# --- broker statistics ---------------------------------------------------------------------------


def _queue_pairs(data: dict[str, Any], what: str) -> list[tuple[MessageQueue, dict[str, Any]]]:
    """The (MessageQueue, value) pairs of an offsetTable, as fastjson or plain JSON wrote it."""
    table = data.get("offsetTable")
    if table is None or table == {}:
        return []
    if not isinstance(table, fastjson.ObjectKeyed):
        raise BadAnswer(what, "offsetTable is not keyed by message queues")
    out = []
    try:
        for key, value in table.pairs:
            queue = MessageQueue(
                str(key["topic"]), str(key["brokerName"]), _int(key["queueId"], "queueId")
            )
            if not isinstance(value, dict):
                raise ValueError(f"the value for {queue} is not an object")
            out.append((queue, value))
    except (KeyError, TypeError, ValueError) as err:
        raise BadAnswer(what, str(err)) from None
    return out


@attrs.frozen
class QueueStatus:
    """One queue of topicStatus: its first and next offsets and its last message's store time."""

    queue: MessageQueue
    min_offset: int
    max_offset: int  # the next offset to be written
    last_update_ms: int  # 0 for an empty queue


def parse_topic_stats(body: bytes, what: str) -> list[QueueStatus]:
    out = []
    for queue, v in _queue_pairs(_object(body, what), what):
        try:
            out.append(
                QueueStatus(
                    queue,
                    _int(v.get("minOffset", 0), "minOffset"),
                    _int(v.get("maxOffset", 0), "maxOffset"),
                    _int(v.get("lastUpdateTimestamp", 0), "lastUpdateTimestamp"),
                )
            )
        except ValueError as err:
            raise BadAnswer(what, str(err)) from None
    return out


@attrs.frozen
class QueueProgress:
    """One queue of consumerProgress: the queue's end, where the group is, and the lag."""

    queue: MessageQueue
    broker_offset: int  # the queue's next offset
    consumer_offset: int  # the group's committed offset (0 when none)
    last_timestamp_ms: int  # store time of the last message consumed, 0 when none

    @property
    def diff(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)


@attrs.frozen
class ConsumeProgress:
    group: str
    queues: tuple[QueueProgress, ...]  # by topic, broker name, queue id
    consume_tps: float

    @property
    def diff_total(self) -> int:
        return sum(q.diff for q in self.queues)


def parse_consume_stats(body: bytes, what: str) -> tuple[list[QueueProgress], float]:
    data = _object(body, what)
    out = []
    for queue, v in _queue_pairs(data, what):
        try:
            out.append(
                QueueProgress(
                    queue,
                    _int(v.get("brokerOffset", 0), "brokerOffset"),
                    _int(v.get("consumerOffset", 0), "consumerOffset"),
                    _int(v.get("lastTimestamp", 0), "lastTimestamp"),
                )
            )
        except ValueError as err:
            raise BadAnswer(what, str(err)) from None
    tps = data.get("consumeTps", 0.0)
    return out, float(tps) if isinstance(tps, int | float) else 0.0


@attrs.frozen
class ConsumerClient:
    client_id: str
    client_addr: str
    language: str
    version: int


@attrs.frozen
class Subscription:
    topic: str
    expression: str  # "*", "TagA || TagB"


@attrs.frozen
class ConsumerConnections:
    """GET_CONSUMER_CONNECTION_LIST merged over the brokers asked: the group's live members."""

    group: str
    clients: tuple[ConsumerClient, ...]  # by client id
    subscriptions: tuple[Subscription, ...]  # by topic
    consume_type: str  # CONSUME_PASSIVELY (push) or CONSUME_ACTIVELY (pull)
    message_model: str  # CLUSTERING or BROADCASTING
    consume_from_where: str


def parse_consumer_connection(group: str, body: bytes, what: str) -> ConsumerConnections:
    data = _object(body, what)
    try:
        clients = tuple(
            ConsumerClient(
                str(c.get("clientId", "")),
                str(c.get("clientAddr", "")),
                str(c.get("language", "")),
                _int(c.get("version", 0), "version"),
            )
            for c in data.get("connectionSet") or []
        )
        subscriptions = tuple(
            Subscription(str(topic), str((sub or {}).get("subString", "*")))
            for topic, sub in (data.get("subscriptionTable") or {}).items()
        )
    except (AttributeError, TypeError, ValueError) as err:
        raise BadAnswer(what, str(err)) from None
    return ConsumerConnections(
        group,
        clients,
        subscriptions,
        str(data.get("consumeType", "")),
        str(data.get("messageModel", "")),
        str(data.get("consumeFromWhere", "")),
    )


def merge_connections(found: list[ConsumerConnections]) -> ConsumerConnections:
    """One view of a group from several brokers' answers: every client once, every topic once;
    the group-wide fields from the first answer."""
    clients = {c.client_id: c for answer in found for c in answer.clients}
    subscriptions = {s.topic: s for answer in found for s in answer.subscriptions}
    first = found[0]
    return attrs.evolve(
        first,
        clients=tuple(clients[k] for k in sorted(clients)),
        subscriptions=tuple(subscriptions[k] for k in sorted(subscriptions)),
    )


def parse_runtime_info(body: bytes, what: str) -> dict[str, str]:
    table = _object(body, what).get("table")
    if not isinstance(table, dict):
        raise BadAnswer(what, "no table")
    return {str(k): str(v) for k, v in table.items()}


def parse_properties(text: str) -> dict[str, str]:
    """`key=value` lines (GET_BROKER_CONFIG's body, Java's MixAll.properties2String)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    return out


@attrs.frozen
class BrokerStatus:
    """GET_BROKER_RUNTIME_INFO of one replica."""

    address: str
    table: Mapping[str, str]


@attrs.frozen
class BrokerConfig:
    """GET_BROKER_CONFIG of one replica: its effective broker.properties."""

    address: str
    properties: Mapping[str, str]


# --- changes -------------------------------------------------------------------------------------


@attrs.frozen
class BrokerChange:
    """A topic or group change (or deletion) one broker group took."""

    broker_name: str  # "" when addressed by -b to an address no name server lists
    address: str  # the replica that answered


@attrs.frozen
class OffsetReset:
    """One queue of resetOffsetByTime: the group's offset before and after."""

    queue: MessageQueue
    old_offset: int  # -1 when the group had none
    new_offset: int


@attrs.frozen
class FoundMessage:
    """A message found by id, key or queue offset, with the broker group that holds it."""

    message: MessageExt
    address: str  # the replica that answered


@attrs.frozen
class LeadershipTransfer:
    """leadershipTransfer's outcome: who leads the group now, in which Raft term."""

    group: str
    previous_leader: str  # Raft node id, "" when none was known
    leader: str
    term: int
    address: str  # the new leader's client address
