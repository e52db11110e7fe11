"""The admin API behind `mqadmin`: one async method per RocketMQ admin operation.

    async with open_admin("127.0.0.1:9876;127.0.0.1:9877") as admin:
        info = await admin.cluster_info()
        await admin.update_topic("Orders", cluster="DefaultCluster", read_queues=8, write_queues=8)
        progress = await admin.consume_progress("order_consumers")
        print(progress.diff_total)

It speaks RocketMQ 4.x's remoting protocol only (docs/protocol.md), so it works against our
brokers and against any RocketMQ 4.x cluster, but for `leadership_transfer`, which drives a
group's DLedger peers directly and needs our brokers. Results are the attrs classes of
client/admin_results.py; failures raise MQBrokerError (a broker or name server refused, with its
code and remark), BrokerUnreachable (no replica of a group answered), NoRouteError, BadAnswer or
BrokerFailure (some brokers of a multi-broker change failed), all MQClientError.

A request to a broker group goes to its master first and to the other replicas when the master
cannot be reached: every replica of our groups answers reads from its own applied state and
forwards writes to its leader, so an operation goes through during a failover. The message
operations (queries, printMsg, offset resets) are in client/admin_messages.py, leadershipTransfer
in client/admin_leadership.py, and sendMessage goes through the Producer; this module is one
class with a method per operation, past 400 lines because they are read together.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from client import admin_messages
from client.admin_results import (
    BrokerChange,
    BrokerConfig,
    BrokerFailure,
    BrokerStatus,
    ClusterInfo,
    ClusterMember,
    ConsumeProgress,
    ConsumerConnections,
    FoundMessage,
    LeadershipTransfer,
    OffsetReset,
    QueueStatus,
    merge_connections,
    parse_cluster_info,
    parse_consume_stats,
    parse_consumer_connection,
    parse_properties,
    parse_runtime_info,
    parse_topic_list,
    parse_topic_stats,
)
from client.errors import BrokerUnreachable, MQBrokerError, MQClientError, NoRouteError
from client.instance import TRANSPORT_FAILURES, ClientInstance, open_instance
from client.message import Message
from client.producer import AsyncProducer
from client.route import PERM_READ, PERM_WRITE, BrokerData, TopicRoute
from client.send_result import SendResult
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.headers import (
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    TopicRequestHeader,
)

NAMESRV_TIMEOUT_S = 3.0  # one name server's answer
BROKER_TIMEOUT_S = 10.0  # one broker's answer; a change waits for the log (the broker's 5 s)
QUEUES_MAX = 1024  # the broker's bound on read and write queue counts
PERM_DEFAULT = PERM_READ | PERM_WRITE  # 6, RocketMQ's updateTopic default
QUEUES_DEFAULT = 8  # RocketMQ's updateTopic default for -r and -w
TOOLS_PRODUCER_GROUP = "TOOLS_PRODUCER"  # sendMessage's producer group, as RocketMQ's tools
SEND_TIMEOUT_S = 10.0  # sendMessage's whole send, every retry included


class Admin:
    """Admin operations over one ClientInstance (its name servers and connections)."""

    def __init__(self, instance: ClientInstance) -> None:
        self.instance = instance

    # --- plumbing --------------------------------------------------------------------------

    async def call(
        self, address: str, command: RemotingCommand, what: str, timeout_s: float = BROKER_TIMEOUT_S
    ) -> RemotingCommand:
        """One request to one address; BrokerUnreachable when it does not answer. Any answer
        is returned, refusals too."""
        try:
            return await self.instance.request(address, command, timeout_s)
        except TRANSPORT_FAILURES as err:
            raise BrokerUnreachable(what, [f"{address}: {_describe(err)}"]) from None

    async def call_ok(
        self, address: str, command: RemotingCommand, what: str, timeout_s: float = BROKER_TIMEOUT_S
    ) -> RemotingCommand:
        """As `call`, raising MQBrokerError for an answer other than SUCCESS."""
        response = await self.call(address, command, what, timeout_s)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, f"{what}: {response.remark}", address)
        return response

    async def call_group(
        self, group: BrokerData, command: RemotingCommand, what: str
    ) -> tuple[RemotingCommand, str]:
        """(answer, address) from the first replica of `group` that answers, master first. A
        request that timed out is sent again to the next replica: only for requests that may
        run twice (reads, and changes that set a value: topics, groups, offsets), never sends."""
        causes = []
        addresses = group.addresses()
        if not addresses:
            raise BrokerUnreachable(what, [f"broker group {group.broker_name} has no address"])
        for address in addresses:
            try:
                return await self.instance.request(address, command, BROKER_TIMEOUT_S), address
            except TRANSPORT_FAILURES as err:
                causes.append(f"{address}: {_describe(err)}")
        raise BrokerUnreachable(f"{what} on {group.broker_name}", causes)

    async def call_group_ok(
        self, group: BrokerData, command: RemotingCommand, what: str
    ) -> tuple[RemotingCommand, str]:
        response, address = await self.call_group(group, command, what)
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, f"{what}: {response.remark}", address)
        return response, address

    async def call_namesrv(
        self, command: RemotingCommand, what: str
    ) -> tuple[RemotingCommand, str]:
        """(answer, address) of the first name server that answers SUCCESS, in the order given;
        MQClientError naming each name server's failure when none does."""
        causes = []
        for address in self.instance.namesrv:
            try:
                response = await self.instance.request(address, command, NAMESRV_TIMEOUT_S)
            except TRANSPORT_FAILURES as err:
                causes.append(f"{address}: {_describe(err)}")
                continue
            if response.code == ResponseCode.SUCCESS:
                return response, address
            causes.append(f"{address}: {MQBrokerError(response.code, response.remark)}")
        raise MQClientError(f"{what}: no name server answered ({'; '.join(causes)})")

    async def gather(self, calls: Sequence[Any]) -> list[Any]:
        """Run the zero-argument async callables in `calls` at once; their results in order.
        An exception of one is returned in its place (the caller reports it), never raised."""
        results: list[Any] = [None] * len(calls)

        async def one(i: int) -> None:
            try:
                results[i] = await calls[i]()
            except MQClientError as err:
                results[i] = err

        async with trio.open_nursery() as nursery:
            for i in range(len(calls)):
                nursery.start_soon(one, i)
        return results

    # --- name server -----------------------------------------------------------------------

    async def cluster_info(self) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO from the first name server that answers."""
        request = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        response, address = await self.call_namesrv(request, "cluster info")
        return parse_cluster_info(response.body, f"ClusterInfo from {address}")

    async def group(self, broker_name: str) -> BrokerData:
        """One broker group's addresses as the name servers hold them."""
        info = await self.cluster_info()
        data = info.brokers.get(broker_name)
        if data is None:
            known = ", ".join(sorted(info.brokers)) or "none"
            raise MQClientError(
                f"no broker group {broker_name!r} at the name servers (groups: {known})"
            )
        return data

    async def cluster_list(self, cluster: str | None = None) -> list[ClusterMember]:
        """Every replica the name servers list (of `cluster` only, when given), each with its
        runtime table, by cluster, broker name and brokerId."""
        info = await self.cluster_info()
        groups = info.groups_of(cluster) if cluster else list(info.brokers.values())
        members = []
        for data in sorted(groups, key=lambda d: (d.cluster, d.broker_name)):
            for broker_id in sorted(data.broker_addrs):
                members.append((data, broker_id, data.broker_addrs[broker_id]))
        tables = await self.gather([lambda a=a: self.broker_status(a) for _d, _i, a in members])
        out = []
        for (data, broker_id, address), status in zip(members, tables, strict=True):
            if isinstance(status, BrokerStatus):
                row = ClusterMember(
                    data.cluster, data.broker_name, broker_id, address, status.table
                )
            else:
                row = ClusterMember(
                    data.cluster, data.broker_name, broker_id, address, {}, str(status)
                )
            out.append(row)
        return out

    async def topic_list(self) -> list[str]:
        request = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        response, address = await self.call_namesrv(request, "topic list")
        return parse_topic_list(response.body, f"TopicList from {address}")

    async def topic_route(self, topic: str) -> TopicRoute:
        """The topic's route, asked now; NoRouteError when no name server knows the topic."""
        route = await self.instance.refresh(topic, force=True)
        if route is None:
            raise NoRouteError(topic, "no name server knows it (create it with updateTopic)")
        return route

    # --- topics ----------------------------------------------------------------------------

    async def topic_status(self, topic: str) -> list[QueueStatus]:
        """GET_TOPIC_STATS_INFO from each broker group of the topic's route."""
        route = await self.topic_route(topic)
        request = RemotingCommand.request(
            RequestCode.GET_TOPIC_STATS_INFO, TopicRequestHeader(topic=topic).encode()
        )
        out: list[QueueStatus] = []
        for data in sorted(route.broker_datas, key=lambda d: d.broker_name):
            response, address = await self.call_group_ok(data, request, f"status of {topic}")
            out += parse_topic_stats(response.body, f"TopicStatsTable from {address}")
        return sorted(out, key=lambda q: (q.queue.broker_name, q.queue.queue_id))

    async def targets(self, cluster: str | None, broker: str | None) -> list[BrokerData]:
        """The groups a change goes to: each group of `cluster`, or the one at address `broker`
        (a group of its own when no name server lists the address: a broker of another
        cluster)."""
        if (cluster is None) == (broker is None):
            raise MQClientError("give either a cluster (-c) or a broker address (-b)")
        info = await self.cluster_info()
        if cluster is not None:
            groups = info.groups_of(cluster)
            if not groups:
                raise MQClientError(f"cluster {cluster!r} has no broker group registered")
            return groups
        assert broker is not None
        found = info.group_at(broker)
        return [BrokerData("", found.broker_name if found else "", {0: broker})]

    async def change_everywhere(
        self, groups: list[BrokerData], request: RemotingCommand, what: str
    ) -> list[BrokerChange]:
        """Send one change to every group (to -b's address only, when that was given); raise
        BrokerFailure naming the groups that refused or did not answer."""

        async def one(data: BrokerData) -> BrokerChange:
            _response, address = await self.call_group_ok(data, request, what)
            return BrokerChange(data.broker_name, address)

        results = await self.gather([lambda d=d: one(d) for d in groups])
        done = [r for r in results if isinstance(r, BrokerChange)]
        failures = [str(r) for r in results if not isinstance(r, BrokerChange)]
        if failures:
            raise BrokerFailure(what, [c.broker_name or c.address for c in done], failures)
        return done

    async def update_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        broker: str | None = None,
        read_queues: int = QUEUES_DEFAULT,
        write_queues: int = QUEUES_DEFAULT,
        perm: int = PERM_DEFAULT,
        order: bool = False,
    ) -> list[BrokerChange]:
        """UPDATE_AND_CREATE_TOPIC on every group of `cluster`, or on the broker at `broker`."""
        for name, count in (("read", read_queues), ("write", write_queues)):
            if not 1 <= count <= QUEUES_MAX:
                raise MQClientError(f"{name} queue count must be 1..{QUEUES_MAX}, not {count}")
        if not 0 <= perm <= 7:
            raise MQClientError(f"perm must be 0..7 (2 write, 4 read, 6 both), not {perm}")
        fields = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(read_queues),
            "writeQueueNums": str(write_queues),
            "perm": str(perm),
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "true" if order else "false",
        }
        request = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        groups = await self.targets(cluster, broker)
        return await self.change_everywhere(groups, request, f"create topic {topic}")

    async def delete_topic(self, topic: str, *, cluster: str) -> list[BrokerChange]:
        """DELETE_TOPIC_IN_BROKER on every group of `cluster`, then DELETE_TOPIC_IN_NAMESRV on
        every name server (in that order, so no broker registers the topic again)."""
        groups = await self.targets(cluster, None)
        request = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        changes = await self.change_everywhere(groups, request, f"delete topic {topic}")
        failures = []
        for address in self.instance.namesrv:
            request = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})
            try:
                await self.call_ok(address, request, f"delete topic {topic}", NAMESRV_TIMEOUT_S)
            except MQClientError as err:
                failures.append(str(err))
        if failures:
            done = [c.broker_name for c in changes]
            raise BrokerFailure(f"delete topic {topic} from the name servers", done, failures)
        return changes

    # --- subscription groups ---------------------------------------------------------------

    async def update_subscription_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker: str | None = None,
        consume_enable: bool = True,
        broadcast_enable: bool = True,
        retry_queues: int = 1,
        retry_max_times: int = 16,
    ) -> list[BrokerChange]:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP with RocketMQ's SubscriptionGroupConfig."""
        if not group:
            raise MQClientError("the group name is empty")
        body = {
            "groupName": group,
            "consumeEnable": consume_enable,
            "consumeFromMinEnable": True,
            "consumeBroadcastEnable": broadcast_enable,
            "retryQueueNums": retry_queues,
            "retryMaxTimes": retry_max_times,
            "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True,
        }
        request = RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(body).encode()
        )
        groups = await self.targets(cluster, broker)
        return await self.change_everywhere(groups, request, f"create subscription group {group}")

    async def delete_subscription_group(
        self, group: str, *, cluster: str | None = None, broker: str | None = None
    ) -> list[BrokerChange]:
        request = RemotingCommand.request(
            RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": group}
        )
        groups = await self.targets(cluster, broker)
        return await self.change_everywhere(groups, request, f"delete subscription group {group}")

    # --- consumers -------------------------------------------------------------------------

    async def consumer_groups_of(self, topic: str | None) -> list[BrokerData]:
        """Where to ask about a consumer group: the topic's groups, or every broker group."""
        if topic:
            route = await self.topic_route(topic)
            return sorted(route.broker_datas, key=lambda d: d.broker_name)
        info = await self.cluster_info()
        return [info.brokers[n] for n in sorted(info.brokers)]

    async def consume_progress(self, group: str, topic: str | None = None) -> ConsumeProgress:
        """GET_CONSUME_STATS from each broker group (of `topic`'s route, when given): per queue
        the queue's end, the group's committed offset and the lag."""
        fields = GetConsumeStatsRequestHeader(consumer_group=group, topic=topic or "").encode()
        request = RemotingCommand.request(RequestCode.GET_CONSUME_STATS, fields)
        queues = []
        tps = 0.0
        for data in await self.consumer_groups_of(topic):
            response, address = await self.call_group_ok(data, request, f"progress of {group}")
            found, group_tps = parse_consume_stats(response.body, f"ConsumeStats from {address}")
            queues += found
            tps += group_tps
        if not queues:
            where = f" on topic {topic}" if topic else ""
            raise MQClientError(
                f"consumer group {group!r} has no offsets and no online member{where}"
            )
        queues.sort(key=lambda q: (q.queue.topic, q.queue.broker_name, q.queue.queue_id))
        return ConsumeProgress(group, tuple(queues), tps)

    async def consumer_connections(self, group: str) -> ConsumerConnections:
        """GET_CONSUMER_CONNECTION_LIST from every broker group, merged: a member heartbeats
        every broker of its topics, each broker knows those that heartbeat it."""
        fields = GetConsumerConnectionListRequestHeader(consumer_group=group).encode()
        request = RemotingCommand.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, fields)
        found = []
        for data in await self.consumer_groups_of(None):
            response, address = await self.call_group(data, request, f"connections of {group}")
            if response.code == ResponseCode.CONSUMER_NOT_ONLINE:
                continue
            if response.code != ResponseCode.SUCCESS:
                raise MQBrokerError(response.code, response.remark, address)
            what = f"ConsumerConnection from {address}"
            found.append(parse_consumer_connection(group, response.body, what))
        if not found:
            raise MQBrokerError(
                ResponseCode.CONSUMER_NOT_ONLINE,
                f"the consumer group[{group}] not online: no broker has a member heartbeating",
            )
        return merge_connections(found)

    # --- brokers ---------------------------------------------------------------------------

    async def broker_status(self, address: str) -> BrokerStatus:
        """GET_BROKER_RUNTIME_INFO of the replica at `address`."""
        request = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        response = await self.call_ok(address, request, "broker status", NAMESRV_TIMEOUT_S)
        what = f"runtime info from {address}"
        return BrokerStatus(address, parse_runtime_info(response.body, what))

    async def broker_config(self, address: str) -> BrokerConfig:
        """GET_BROKER_CONFIG of the replica at `address`."""
        request = RemotingCommand.request(RequestCode.GET_BROKER_CONFIG)
        response = await self.call_ok(address, request, "broker config", NAMESRV_TIMEOUT_S)
        text = response.body.decode("utf-8", errors="replace")
        return BrokerConfig(address, parse_properties(text))

    async def cluster_addresses(self, cluster: str) -> list[str]:
        """Every replica address of `cluster`'s groups, by group then brokerId."""
        info = await self.cluster_info()
        return [a for data in info.groups_of(cluster) for a in data.addresses()]

    # --- messages (client/admin_messages.py) -----------------------------------------------

    async def query_message_by_id(
        self, msg_id: str, topic: str | None = None
    ) -> list[FoundMessage]:
        return await admin_messages.by_id(self, msg_id, topic)

    async def query_message_by_key(
        self,
        topic: str,
        key: str,
        *,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_num: int = admin_messages.QUERY_MESSAGES_MAX,
    ) -> list[FoundMessage]:
        return await admin_messages.by_key(self, topic, key, begin_ms, end_ms, max_num)

    async def query_message_by_offset(
        self, topic: str, broker_name: str, queue_id: int, queue_offset: int
    ) -> FoundMessage:
        return await admin_messages.by_offset(self, topic, broker_name, queue_id, queue_offset)

    async def send_message(
        self,
        topic: str,
        body: bytes,
        *,
        keys: str | None = None,
        tags: str | None = None,
        broker_name: str | None = None,
        queue_id: int | None = None,
    ) -> SendResult:
        """One message through a Producer (group TOOLS_PRODUCER, RocketMQ's), to any write
        queue of `topic` or, with `broker_name` and/or `queue_id`, to one of the matching
        queues picked at random (an ordered send to it: it never moves elsewhere). The topic
        must exist: an operator's test message never auto-creates one. Raises what
        Producer.send raises (SendOutcomeUnknown when the outcome is unknown)."""
        route = await self.topic_route(topic)
        queues = [
            q
            for q in route.write_queues()
            if (broker_name is None or q.broker_name == broker_name)
            and (queue_id is None or q.queue_id == queue_id)
        ]
        if not queues:
            where = f" on broker {broker_name}" if broker_name else ""
            which = f" with id {queue_id}" if queue_id is not None else ""
            raise MQClientError(f"topic {topic} has no writable queue{which}{where}")
        message = Message(topic, body, tags=tags or None, keys=keys or None)
        async with AsyncProducer(
            TOOLS_PRODUCER_GROUP, self.instance.namesrv, send_timeout=SEND_TIMEOUT_S
        ) as producer:
            if broker_name is None and queue_id is None:
                return await producer.send(message)
            chosen = random.choice(queues)
            return await producer.send(message, selector=lambda *_: chosen)

    async def print_messages(
        self,
        topic: str,
        *,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        begin_offset: int | None = None,
        end_offset: int | None = None,
        count_max: int = admin_messages.PRINT_COUNT_DEFAULT,
    ) -> list[FoundMessage]:
        return await admin_messages.print_range(
            self, topic, begin_ms, end_ms, begin_offset, end_offset, count_max
        )

    async def reset_offset_by_time(
        self, group: str, topic: str, timestamp_ms: int
    ) -> list[OffsetReset]:
        return await admin_messages.reset_by_time(self, group, topic, timestamp_ms)

    # --- DLedger ---------------------------------------------------------------------------

    async def leadership_transfer(
        self, group: str, target: str, *, timeout_s: float = 10.0
    ) -> LeadershipTransfer:
        """Make the replica with Raft id `target` the master of broker group `group`
        (client/admin_leadership.py); returns once the name servers list it as master."""
        # dledger's client (and the dledger package it loads, ~0.3 s) only for this command
        from client import admin_leadership

        return await admin_leadership.transfer(self, group, target, timeout_s)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _describe(err: BaseException) -> str:
    if isinstance(err, trio.TooSlowError):
        return "timed out"
    return str(err) or type(err).__name__


@asynccontextmanager
async def open_admin(namesrv: str | Sequence[str]) -> AsyncIterator[Admin]:
    """An Admin whose connections close when the block ends. `namesrv`: "a:9876;b:9876"."""
    async with open_instance(namesrv, instance_name=f"mqadmin-{now_ms()}") as instance:
        yield Admin(instance)
