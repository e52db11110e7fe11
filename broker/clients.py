"""Producers and consumers a replica knows from their heartbeats, and queue locks.

A client is registered by HEART_BEAT on the connection it came in on and forgotten when that
connection closes, when it unregisters, or after CLIENT_EXPIRY_S without a heartbeat (as
RocketMQ's ConsumerManager does). Each subscription's filter is compiled when its heartbeat
arrives, once per subVersion (broker/filter/); pulls without a subscription of their own use it. When a consumer group's members change, every member still
connected is told (NOTIFY_CONSUMER_IDS_CHANGED), so it rebalances at once.

Queue locks (orderly consumption) are not kept here: they go through the log, so they hold
across a leader change (broker/metadata.py, Metadata.lock_op).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
import trio

from broker.filter.errors import FilterError
from broker.filter.subscription import (
    EVERYTHING,
    TAG,
    SubscriptionFilter,
    compile_subscription,
    expression_type_of,
    parse_tags,
)
from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.errors import RemotingError

log = logging.getLogger("broker.clients")

CLIENT_EXPIRY_S = 120.0  # RocketMQ's channelExpiredTimeout
SCAN_INTERVAL_S = 10.0
NOTIFY_TIMEOUT_S = 3.0
MESSAGE_MODELS = {
    0: "BROADCASTING",
    1: "CLUSTERING",
    "BROADCASTING": "BROADCASTING",
    "CLUSTERING": "CLUSTERING",
}
CONSUME_TYPES = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY"}


@attrs.define
class Subscription:
    topic: str
    expression: str
    tags: frozenset[str]  # empty: every tag ("*")
    version: int
    expression_type: str = TAG  # TAG or SQL92 (or whatever unknown type the client sent)
    # compiled at the heartbeat (broker/filter/); None when the expression is bad, `error` says
    # why and a pull relying on it is refused (FILTER_DATA_NOT_EXIST, as RocketMQ)
    filter: SubscriptionFilter | None = EVERYTHING
    error: str | None = None


@attrs.define
class Member:
    client_id: str
    connection: Connection
    last_seen: float
    subscriptions: dict[str, Subscription] = attrs.field(factory=dict)
    message_model: str = "CLUSTERING"
    consume_type: str = "CONSUME_PASSIVELY"
    consume_from: object = 0
    language: str = "?"
    version: int = 0


def compile_subscription_data(data: dict[str, Any], previous: Subscription | None) -> Subscription:
    """A heartbeat's SubscriptionData, its filter compiled (or the member's previous one kept,
    when topic, type, expression and subVersion are the same: one parse per subVersion)."""
    topic = str(data.get("topic", ""))
    expression = str(data.get("subString", "*"))
    expression_type = expression_type_of(str(data.get("expressionType") or ""))
    version = int(data.get("subVersion", 0) or 0)
    if previous is not None and (
        previous.expression,
        previous.expression_type,
        previous.version,
    ) == (expression, expression_type, version):
        return previous
    tags = parse_tags(expression) if expression_type == TAG else frozenset()
    try:
        compiled = compile_subscription(expression_type, expression)
    except FilterError as err:
        log.warning("subscription to %s refused: %s: %s", topic, err, expression[:200])
        return Subscription(topic, expression, tags, version, expression_type, None, str(err))
    return Subscription(topic, expression, tags, version, expression_type, compiled)


class ClientRegistry:
    def __init__(self) -> None:
        self.consumers: dict[str, dict[str, Member]] = {}
        self.producers: dict[str, dict[str, Member]] = {}
        self._watched: set[int] = set()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(SCAN_INTERVAL_S)
                self.expire(trio.current_time())

    # --- heartbeats ------------------------------------------------------------------------

    def heartbeat(
        self, body: dict[str, Any], connection: Connection, language: str, version: int
    ) -> list[tuple[str, str]]:
        """Register what a HEART_BEAT says; returns the (group, message model) of each consumer
        group in it (the handler creates their retry topics)."""
        client_id = str(body.get("clientID", ""))
        now = trio.current_time()
        groups = []
        for data in body.get("consumerDataSet") or []:
            group = str(data.get("groupName", ""))
            if not group:
                continue
            model = MESSAGE_MODELS.get(data.get("messageModel"), "CLUSTERING")
            member = Member(
                client_id,
                connection,
                now,
                message_model=model,
                consume_type=CONSUME_TYPES.get(
                    data.get("consumeType"), str(data.get("consumeType"))
                ),
                consume_from=data.get("consumeFromWhere", 0),
                language=language,
                version=version,
            )
            members = self.consumers.setdefault(group, {})
            before = members.get(client_id)
            for sub in data.get("subscriptionDataSet") or []:
                topic = str(sub.get("topic", ""))
                previous = before.subscriptions.get(topic) if before is not None else None
                member.subscriptions[topic] = compile_subscription_data(sub, previous)
            joined = client_id not in members
            members[client_id] = member
            if joined:
                log.info("consumer %s joined group %s", client_id, group)
                self._notify(group)
            groups.append((group, model))
        for data in body.get("producerDataSet") or []:
            group = str(data.get("groupName", ""))
            if group:
                self.producers.setdefault(group, {})[client_id] = Member(
                    client_id, connection, now, language=language, version=version
                )
        self._watch(connection)
        return groups

    def unregister(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None:
        if producer_group:
            self.producers.get(producer_group, {}).pop(client_id, None)
        if consumer_group and self.consumers.get(consumer_group, {}).pop(client_id, None):
            self._notify(consumer_group)

    def consumer_ids(self, group: str) -> list[str]:
        return sorted(self.consumers.get(group, {}))

    def subscription(self, group: str, topic: str) -> Subscription | None:
        for member in self.consumers.get(group, {}).values():
            sub = member.subscriptions.get(topic)
            if sub is not None:
                return sub
        return None

    def expire(self, now: float) -> None:
        for table, is_consumer in ((self.consumers, True), (self.producers, False)):
            for group, members in list(table.items()):
                gone = [c for c, m in members.items() if now - m.last_seen > CLIENT_EXPIRY_S]
                for client_id in gone:
                    del members[client_id]
                    log.info("client %s of group %s expired", client_id, group)
                if gone and is_consumer:
                    self._notify(group)
                if not members:
                    del table[group]

    def _watch(self, connection: Connection) -> None:
        if id(connection) in self._watched or self._nursery is None:
            return
        self._watched.add(id(connection))
        self._nursery.start_soon(self._forget_when_closed, connection)

    async def _forget_when_closed(self, connection: Connection) -> None:
        try:
            await connection.wait_closed()
        finally:
            self._watched.discard(id(connection))
        for table, is_consumer in ((self.consumers, True), (self.producers, False)):
            for group, members in list(table.items()):
                gone = [c for c, m in members.items() if m.connection is connection]
                for client_id in gone:
                    del members[client_id]
                if gone and is_consumer:
                    self._notify(group)
                if not members:
                    del table[group]

    def _notify(self, group: str) -> None:
        if self._nursery is None:
            return
        for member in list(self.consumers.get(group, {}).values()):
            self._nursery.start_soon(self._notify_one, member.connection, group)

    @staticmethod
    async def _notify_one(connection: Connection, group: str) -> None:
        request = RemotingCommand.request(
            RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}, oneway=True
        )
        try:
            with trio.move_on_after(NOTIFY_TIMEOUT_S):
                await connection.send_oneway(request)
        except RemotingError as err:
            log.debug("could not notify %s of group %s: %s", connection.peer, group, err)


def decode_json_body(body: bytes) -> dict[str, Any]:
    """A request's JSON body (Java may send unquoted numeric keys; we do not read those)."""
    if not body:
        return {}
    value = json.loads(body.decode("utf-8", errors="replace"))
    if not isinstance(value, dict):
        raise ValueError("the body is not a JSON object")
    return value
