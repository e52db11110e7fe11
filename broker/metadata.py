"""The broker's replicated metadata: topic configs, subscription groups, consumer offsets,
queue locks, the delivery progress of delayed messages (broker/schedule_progress.py) and the
pending half messages of transactions (broker/transaction_progress.py).

Every change is an operation carried by a log entry (broker/entries.py), applied by every
replica in log order, so a new leader has it at once. Operations are "set" or "delete" of one
key, so applying the same operation again changes nothing, and a snapshot (the whole state as
a dict) plus the operations after it gives the same state as the whole history.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from broker.delays import SCHEDULE_TOPICS
from broker.schedule_progress import DeliveryProgress
from broker.transaction_progress import TXN_OPS, TransactionProgress
from broker.transactions import HALF_TOPIC

PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1
DEFAULT_TOPIC = "TBW102"  # RocketMQ's template for auto-created topics (AUTO_CREATE_TOPIC_KEY)
RETRY_GROUP_PREFIX = "%RETRY%"
DLQ_GROUP_PREFIX = "%DLQ%"
TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")  # RocketMQ's Validators rule
TOPIC_CHARS_MAX = 127
GROUP_NAME = TOPIC_NAME
LOCKS_MAX = 100_000  # queue locks kept (a bound; only live consumers renew theirs)
QUEUES_MAX = 1024  # per topic; RocketMQ has no hard bound, we keep a queue's files bounded
SYSTEM_TOPICS = frozenset({DEFAULT_TOPIC, *SCHEDULE_TOPICS, HALF_TOPIC})


def topic_problem(topic: str) -> str | None:
    """Why `topic` is not a legal topic name, or None."""
    if not topic:
        return "the topic is empty"
    if len(topic) > TOPIC_CHARS_MAX:
        return f"the topic is {len(topic)} characters long; at most {TOPIC_CHARS_MAX}"
    if not TOPIC_NAME.match(topic):
        return f"the topic {topic!r} has characters outside [%|a-zA-Z0-9_-]"
    return None


@attrs.frozen
class TopicConfig:
    name: str
    read_queues: int = 8
    write_queues: int = 8
    perm: int = PERM_READ | PERM_WRITE
    sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        """RocketMQ's TopicConfig JSON (topicConfigTable values, GET_ALL_TOPIC_CONFIG)."""
        return {
            "topicName": self.name,
            "readQueueNums": self.read_queues,
            "writeQueueNums": self.write_queues,
            "perm": self.perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": self.sys_flag,
            "order": self.order,
        }

    def to_row(self) -> list[Any]:
        return [
            self.name,
            self.read_queues,
            self.write_queues,
            self.perm,
            self.sys_flag,
            self.order,
        ]

    @classmethod
    def from_row(cls, row: list[Any]) -> TopicConfig:
        name, read, write, perm, sys_flag, order = row
        return cls(str(name), int(read), int(write), int(perm), int(sys_flag), bool(order))

    @property
    def queues(self) -> int:
        """Queues that exist (hold files): the larger of the read and write counts."""
        return max(self.read_queues, self.write_queues)


@attrs.frozen
class GroupConfig:
    name: str
    consume_enable: bool = True
    broadcast_enable: bool = True
    retry_queues: int = 1
    retry_max_times: int = 16  # maxReconsumeTimes: then to %DLQ%<group>

    def to_json(self) -> dict[str, Any]:
        """RocketMQ's SubscriptionGroupConfig JSON."""
        return {
            "groupName": self.name,
            "consumeEnable": self.consume_enable,
            "consumeFromMinEnable": True,
            "consumeBroadcastEnable": self.broadcast_enable,
            "retryQueueNums": self.retry_queues,
            "retryMaxTimes": self.retry_max_times,
            "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True,
        }

    def to_row(self) -> list[Any]:
        return [
            self.name,
            self.consume_enable,
            self.broadcast_enable,
            self.retry_queues,
            self.retry_max_times,
        ]

    @classmethod
    def from_row(cls, row: list[Any]) -> GroupConfig:
        name, consume, broadcast, retry_queues, retry_max = row
        return cls(str(name), bool(consume), bool(broadcast), int(retry_queues), int(retry_max))


OffsetKey = tuple[str, str, int]  # (group, topic, queue_id)
LockKey = tuple[str, str, str, int]  # (group, topic, broker name, queue_id)
LOCK_EXPIRY_MS = 60_000  # RocketMQ's rebalance lock lifetime: unrenewed this long, a lock is free


class Metadata:
    """What every replica holds of topics, groups and consumer offsets."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicConfig] = {}
        self.groups: dict[str, GroupConfig] = {}
        self.offsets: dict[OffsetKey, int] = {}
        # when the replica that took each offset's commit received it (ms, its clock): a commit
        # written to the log late (its replica was cut off) never replaces a newer one
        self.offset_times: dict[OffsetKey, int] = {}
        # queue locks of orderly consumers: (client id, ms of its last (re)lock, the
        # proposer's clock), decided by every replica as the lock entry is applied
        self.locks: dict[LockKey, tuple[str, int]] = {}
        # delivery progress of the schedule queues (delayed messages, broker/schedule.py)
        self.schedule = DeliveryProgress()
        # half messages of transactions not resolved yet (broker/transaction_check.py)
        self.transactions = TransactionProgress()
        self.version = 0  # counts applied changes (RocketMQ's dataVersion counter)

    # --- operations (broker/entries.py carries them) ---------------------------------------

    def apply(self, op: Mapping[str, Any]) -> None:
        """Apply one operation; an unknown one is skipped (a newer broker's, deterministic)."""
        kind = op.get("op")
        if kind == "topic":
            config = TopicConfig.from_row(op["config"])
            self.topics[config.name] = config
        elif kind == "delete_topic":
            topic = op["topic"]
            self.topics.pop(topic, None)
            for key in [k for k in self.offsets if k[1] == topic]:
                del self.offsets[key]
                self.offset_times.pop(key, None)
        elif kind == "group":
            group = GroupConfig.from_row(op["config"])
            self.groups[group.name] = group
        elif kind == "delete_group":
            name = op["group"]
            self.groups.pop(name, None)
            for key in [k for k in self.offsets if k[0] == name]:
                del self.offsets[key]
                self.offset_times.pop(key, None)
        elif kind == "offsets":
            self._offsets(op)
        elif kind == "lock":
            self._lock(op)
            return  # locks are not topic data: the version (registrations) stays
        elif kind == "unlock":
            for topic, broker_name, queue_id in op["queues"]:
                lock_key = (str(op["group"]), str(topic), str(broker_name), int(queue_id))
                holder = self.locks.get(lock_key)
                if holder is not None and holder[0] == op["client"]:
                    del self.locks[lock_key]
            return
        elif kind in ("delivered", "schedule_skip"):
            self.schedule.apply(op)
            return  # not topic data either
        elif kind in TXN_OPS:
            self.transactions.apply(op)
            return  # nor this
        elif kind == "snapshot":
            return  # BrokerState decides whether a snapshot applies (broker/state.py)
        else:
            return
        self.version += 1

    @staticmethod
    def topic_op(config: TopicConfig) -> dict[str, Any]:
        return {"op": "topic", "config": config.to_row()}

    @staticmethod
    def group_op(config: GroupConfig) -> dict[str, Any]:
        return {"op": "group", "config": config.to_row()}

    def _lock(self, op: Mapping[str, Any]) -> None:
        """Grant each queue to op's client unless another client renewed it within the
        expiry, by the time the entry carries: the same decision on every replica."""
        at_ms, client = int(op["at_ms"]), op["client"]
        for topic, broker_name, queue_id in op["queues"]:
            key = (op["group"], topic, broker_name, int(queue_id))
            holder = self.locks.get(key)
            if holder is None or holder[0] == client or at_ms - holder[1] > LOCK_EXPIRY_MS:
                self.locks[key] = (client, max(at_ms, holder[1] if holder else 0))
        if len(self.locks) > LOCKS_MAX:  # forget the stalest first
            for key, _ in sorted(self.locks.items(), key=lambda kv: kv[1][1])[
                : len(self.locks) - LOCKS_MAX
            ]:
                del self.locks[key]

    def held_by(
        self, group: str, client: str, queues: Iterable[tuple[str, str, int]]
    ) -> list[tuple[str, str, int]]:
        held = []
        for topic, broker_name, queue_id in queues:
            holder = self.locks.get((group, topic, broker_name, queue_id))
            if holder is not None and holder[0] == client:
                held.append((topic, broker_name, queue_id))
        return held

    @staticmethod
    def lock_op(
        group: str, client: str, queues: Iterable[tuple[str, str, int]], at_ms: int
    ) -> dict[str, Any]:
        return {
            "op": "lock",
            "group": group,
            "client": client,
            "queues": [list(q) for q in queues],
            "at_ms": at_ms,
        }

    @staticmethod
    def unlock_op(
        group: str, client: str, queues: Iterable[tuple[str, str, int]]
    ) -> dict[str, Any]:
        return {
            "op": "unlock",
            "group": group,
            "client": client,
            "queues": [list(q) for q in queues],
        }

    def snapshot_op(self, as_of_index: int, at_ms: int) -> dict[str, Any]:
        """The whole state as of applied index `as_of_index`, for a replica that rebuilds
        from a log whose older entries retention deleted."""
        return {"op": "snapshot", "as_of": as_of_index, "at_ms": at_ms, "state": self.state()}

    def _offsets(self, op: Mapping[str, Any]) -> None:
        """Committed offsets, each with the time its commit reached a replica: one older
        than the offset's last applied commit is skipped (two replicas took commits of one
        queue, and the one that took the older could write it only later). An entry without
        times (older brokers) sets every offset it holds."""
        times = op.get("received_ms")
        for i, (group, topic, queue_id, offset) in enumerate(op["offsets"]):
            key = (group, topic, int(queue_id))
            if times is None:
                self.offset_times.pop(key, None)
            else:
                at = int(times[i])
                if at < self.offset_times.get(key, at):
                    continue
                self.offset_times[key] = at
            self.offsets[key] = int(offset)

    @staticmethod
    def offsets_op(offsets: Iterable[tuple[OffsetKey, int, int]]) -> dict[str, Any]:
        """Rows of (key, offset, received ms)."""
        rows = list(offsets)
        return {
            "op": "offsets",
            "offsets": [[g, t, q, o] for (g, t, q), o, _at in rows],
            "received_ms": [at for _key, _o, at in rows],
        }

    # --- whole state (snapshots and the local checkpoint) ----------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "topics": [t.to_row() for t in self.topics.values()],
            "groups": [g.to_row() for g in self.groups.values()],
            "offsets": [[g, t, q, o] for (g, t, q), o in self.offsets.items()],
            "offset_times": [[g, t, q, at] for (g, t, q), at in self.offset_times.items()],
            "locks": [[*key, c, at] for key, (c, at) in self.locks.items()],
            "schedule": self.schedule.state(),
            "transactions": self.transactions.state(),
            "version": self.version,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.topics = {row[0]: TopicConfig.from_row(row) for row in state["topics"]}
        self.groups = {row[0]: GroupConfig.from_row(row) for row in state["groups"]}
        self.offsets = {(g, t, int(q)): int(o) for g, t, q, o in state["offsets"]}
        self.offset_times = {
            (g, t, int(q)): int(at) for g, t, q, at in state.get("offset_times", ())
        }
        self.locks = {
            (g, t, b, int(q)): (c, int(at)) for g, t, b, q, c, at in state.get("locks", ())
        }
        self.schedule.restore(state.get("schedule", ()))
        self.transactions.restore(state.get("transactions", {}))
        self.version = int(state.get("version", 0))
