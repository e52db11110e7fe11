"""The requests a consumer makes of brokers, each tried on every replica of the group.

`ConsumerRequests.call` sends to a broker group: the preferred replica first (a pull's
suggestWhichBrokerId), then the master (brokerId 0), then the other replicas. A transport
failure (dropped connection, refused connect, timeout) or a refusal that another replica may
not repeat (SYSTEM_ERROR, SYSTEM_BUSY, SERVICE_NOT_AVAILABLE) refreshes the topic's route at
once and moves to the next address. Every replica of our broker serves reads from its applied
state and forwards writes to its leader, so any of them will do; on a Java master/slave pair
the master is tried first and slaves serve pulls.

What fails on every address raises MQBrokerError (the last refusal, naming the broker) or
BrokerUnreachable (what each attempt saw).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable

import attrs
import trio

from client.errors import BrokerUnreachable, MQBrokerError, MQClientError, NoRouteError
from client.instance import TRANSPORT_FAILURES, ClientInstance
from client.message import MessageExt, MessageQueue, decode_records
from client.route import MASTER_ID
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import HeaderFieldError, MessageFormatError
from remoting.headers import (
    OFFSET_UNSETTLED_AT_ONCE_FIELD,
    OFFSET_UNSETTLED_FIELD,
    ConsumerSendMsgBackRequestHeader,
    GetConsumerListByGroupRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueueRequestHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)

log = logging.getLogger("client.consumer_requests")

REQUEST_TIMEOUT_S = 3.0  # the C++ client's default for a synchronous request
# Answers another replica may not give: try the next one.
OTHER_REPLICA_CODES = frozenset(
    {ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE}
)
# A pull's normal answers (everything else is retried on another replica, then raised).
PULL_CODES = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    }
)
FLAG_COMMIT_OFFSET, FLAG_SUSPEND, FLAG_SUBSCRIPTION = 1, 2, 4  # PullSysFlag


@attrs.frozen
class RawPull:
    """A pull's answer as the broker gave it: every record, before the client's tag filter."""

    code: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int
    messages: list[MessageExt]
    address: str


def describe(err: BaseException) -> str:
    return str(err) or type(err).__name__


class ConsumerRequests:
    def __init__(self, instance: ClientInstance) -> None:
        self.instance = instance

    # --- the one way requests go out -------------------------------------------------------

    def addresses(self, broker_name: str, prefer_id: int | None = None) -> list[str]:
        data = self.instance.broker_data(broker_name)
        if data is None:
            return []
        out = data.addresses()  # master first
        if prefer_id is not None and prefer_id != MASTER_ID:
            preferred = data.broker_addrs.get(prefer_id)
            if preferred is not None:
                out.remove(preferred)
                out.insert(0, preferred)
        return out

    async def refresh(self, topic: str) -> None:
        try:
            await self.instance.refresh(topic)
        except NoRouteError as err:
            log.debug("route refresh of %s: %s", topic, err)

    async def call(
        self,
        topic: str,
        broker_name: str,
        command: RemotingCommand,
        what: str,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        prefer_id: int | None = None,
        accept: Collection[int] | None = None,
        exclude: Collection[str] = (),
    ) -> tuple[RemotingCommand, str]:
        """The first answer from the group `broker_name` that is not a transport failure nor a
        refusal worth another replica (or, with `accept`, is one of those codes), and the
        address that gave it; replicas in `exclude` are not asked."""
        if self.instance.broker_data(broker_name) is None:
            if self.instance.cached_route(topic) is None:
                await self.instance.route(topic)  # first use: fetch it (NoRouteError if none)
            else:
                await self.refresh(topic)  # the group left the route: has it come back?
        tried: list[str] = list(exclude)
        causes: list[str] = []
        refused: tuple[RemotingCommand, str] | None = None
        while True:
            candidates = [a for a in self.addresses(broker_name, prefer_id) if a not in tried]
            if not candidates:
                if refused is not None:
                    response, address = refused
                    raise MQBrokerError(response.code, f"{what}: {response.remark}", address)
                if not causes:
                    causes.append(f"no address of {broker_name} is known")
                raise BrokerUnreachable(what, causes)
            address = candidates[0]
            tried.append(address)
            try:
                response = await self.instance.request(address, command, timeout_s)
            except TRANSPORT_FAILURES as err:
                causes.append(f"{address}: {describe(err)}")
                await self.refresh(topic)
                continue
            if accept is not None:
                another = response.code not in accept
            else:
                another = response.code in OTHER_REPLICA_CODES
            if another:
                causes.append(f"{address}: code {response.code} {response.remark}")
                refused = (response, address)
                await self.refresh(topic)
                continue
            return response, address

    # --- pulls -----------------------------------------------------------------------------

    async def pull(
        self,
        group: str,
        queue: MessageQueue,
        offset: int,
        *,
        max_nums: int,
        expression: str,
        sub_version: int,
        suspend_ms: int,
        commit_offset: int | None,
        timeout_s: float,
        prefer_id: int | None = None,
        expression_type: str = "TAG",
    ) -> RawPull:
        sys_flag = FLAG_SUBSCRIPTION
        if suspend_ms > 0:
            sys_flag |= FLAG_SUSPEND
        if commit_offset is not None:
            sys_flag |= FLAG_COMMIT_OFFSET
        header = PullMessageRequestHeader(
            consumer_group=group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            queue_offset=offset,
            max_msg_nums=max_nums,
            sys_flag=sys_flag,
            commit_offset=commit_offset if commit_offset is not None else 0,
            suspend_timeout_millis=max(0, suspend_ms),
            subscription=expression,
            sub_version=sub_version,
            expression_type=expression_type,
        )
        command = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.encode())
        response, address = await self.call(
            queue.topic,
            queue.broker_name,
            command,
            f"pull {queue} at {offset}",
            timeout_s=timeout_s,
            prefer_id=prefer_id,
            accept=PULL_CODES,
        )
        try:
            fields = PullMessageResponseHeader.decode(response.ext_fields)
        except HeaderFieldError as err:
            raise MQBrokerError(response.code, f"unreadable pull answer: {err}", address) from None
        messages: list[MessageExt] = []
        if response.code == ResponseCode.SUCCESS:
            try:
                messages = decode_records(response.body, queue.broker_name)
            except (MessageFormatError, ValueError) as err:
                raise MQBrokerError(
                    response.code, f"unreadable records in a pull of {queue}: {err}", address
                ) from None
        return RawPull(
            code=response.code,
            next_begin_offset=fields.next_begin_offset,
            min_offset=fields.min_offset,
            max_offset=fields.max_offset,
            suggest_which_broker_id=fields.suggest_which_broker_id,
            messages=messages,
            address=address,
        )

    # --- offsets ---------------------------------------------------------------------------

    async def _offset(
        self,
        queue: MessageQueue,
        command: RemotingCommand,
        what: str,
        accept: Collection[int],
        exclude: Collection[str] = (),
    ) -> tuple[int | None, RemotingCommand, str]:
        response, address = await self.call(
            queue.topic, queue.broker_name, command, what, accept=accept, exclude=exclude
        )
        if response.code != ResponseCode.SUCCESS:
            return None, response, address
        try:
            return OffsetResponseHeader.decode(response.ext_fields).offset, response, address
        except HeaderFieldError as err:
            raise MQBrokerError(response.code, f"{what}: {err}", address) from None

    async def query_offset(self, group: str, queue: MessageQueue) -> int | None:
        """The group's committed offset of `queue`; None when the broker has none
        (QUERY_NOT_FOUND). A broker answers 0 for a queue nothing was deleted from yet.

        A replica of ours that cannot settle the read (it knows no leader) answers with what it
        has, marked unsettled (docs/protocol.md#offsetunsettled): it may be older than the
        group's commit, and starting there would consume again what was consumed since. So the
        group's other replicas are asked in turn, first each asked to answer at once if it
        knows no leader (a replica cut off from its group then costs a round trip, not its 2 s
        wait for an election), then, if none settled, again with the wait (an election may end
        meanwhile). If none settles either, the newest answer is taken (a rewind is still
        possible then, a skip never: no replica holds an offset that was not committed)."""
        plain = QueryConsumerOffsetRequestHeader(
            consumer_group=group, topic=queue.topic, queue_id=queue.queue_id
        ).encode()
        what = f"query the offset of {group} on {queue}"
        accept = {ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND}
        unsettled: list[int | None] = []
        for fields in ({**plain, OFFSET_UNSETTLED_AT_ONCE_FIELD: "true"}, plain):
            command = RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, fields)
            asked: list[str] = []
            while True:
                try:
                    offset, response, address = await self._offset(
                        queue, command, what, accept, exclude=asked
                    )
                except MQClientError:
                    if unsettled:  # no other replica answered in this pass
                        break
                    raise
                if response.ext_fields.get(OFFSET_UNSETTLED_FIELD) != "true":
                    return offset
                log.debug(
                    "%s: %s answered %s unsettled (it knows no leader)", what, address, offset
                )
                unsettled.append(offset)
                asked.append(address)
        newest = max(unsettled, key=_offset_order)
        log.warning(
            "%s: no replica could settle the read (none knows a leader); taking the newest "
            "offset any of them holds, %s, which may be older than the group's last commit",
            what,
            newest,
        )
        return newest

    async def update_offset(self, group: str, queue: MessageQueue, offset: int) -> None:
        header = UpdateConsumerOffsetRequestHeader(
            consumer_group=group, topic=queue.topic, queue_id=queue.queue_id, commit_offset=offset
        )
        command = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, header.encode())
        await self.call(
            queue.topic,
            queue.broker_name,
            command,
            f"commit offset {offset} of {group} on {queue}",
            accept={ResponseCode.SUCCESS},
        )

    async def queue_offset(self, code: RequestCode, queue: MessageQueue) -> int:
        """GET_MAX_OFFSET (the next offset) or GET_MIN_OFFSET (the first kept) of `queue`."""
        header = QueueRequestHeader(topic=queue.topic, queue_id=queue.queue_id)
        offset, _, _ = await self._offset(
            queue,
            RemotingCommand.request(code, header.encode()),
            f"{code.name} of {queue}",
            {ResponseCode.SUCCESS},
        )
        assert offset is not None
        return offset

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after `timestamp_ms` (the queue's end when none)."""
        header = SearchOffsetRequestHeader(
            topic=queue.topic, queue_id=queue.queue_id, timestamp=timestamp_ms
        )
        command = RemotingCommand.request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header.encode())
        offset, _, _ = await self._offset(
            queue, command, f"search {queue} at {timestamp_ms} ms", {ResponseCode.SUCCESS}
        )
        assert offset is not None
        return offset

    async def earliest_store_time(self, queue: MessageQueue) -> int:
        """Store time (ms) of the first message kept in `queue`."""
        header = QueueRequestHeader(topic=queue.topic, queue_id=queue.queue_id)
        command = RemotingCommand.request(RequestCode.GET_EARLIEST_MSG_STORETIME, header.encode())
        response, address = await self.call(
            queue.topic, queue.broker_name, command, f"earliest store time of {queue}"
        )
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        value = response.ext_fields.get("timestamp")
        if value is None or not str(value).lstrip("-").isdigit():
            raise MQBrokerError(response.code, f"no timestamp in the answer: {value!r}", address)
        return int(value)

    # --- the group -------------------------------------------------------------------------

    async def consumer_ids(self, group: str, topic: str) -> list[str] | None:
        """The group's members as a broker of `topic` knows them (GET_CONSUMER_LIST_BY_GROUP),
        sorted; None when no broker of the topic could say."""
        route = await self.instance.route(topic)
        header = GetConsumerListByGroupRequestHeader(consumer_group=group)
        command = RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, header.encode())
        for data in sorted(route.broker_datas, key=lambda b: b.broker_name):
            try:
                response, address = await self.call(
                    topic, data.broker_name, command, f"members of {group}"
                )
            except (MQBrokerError, BrokerUnreachable) as err:
                log.debug("%s", err)
                continue
            if response.code != ResponseCode.SUCCESS:
                log.debug("members of %s from %s: %s", group, address, response.remark)
                continue
            try:
                ids = json.loads(response.body or b"{}").get("consumerIdList") or []
            except (ValueError, AttributeError) as err:
                log.warning("unreadable member list of %s from %s: %s", group, address, err)
                continue
            return sorted(str(i) for i in ids)
        return None

    async def lock(
        self, group: str, client_id: str, broker_name: str, queues: Iterable[MessageQueue]
    ) -> set[MessageQueue]:
        """LOCK_BATCH_MQ on the group's master (another replica when it fails): the queues
        now locked for this client (a lease of 60 s on the broker)."""
        wanted = sorted(queues)
        if not wanted:
            return set()
        body = {
            "consumerGroup": group,
            "clientId": client_id,
            "mqSet": [q.as_json() for q in wanted],
        }
        command = RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, {}, json.dumps(body).encode())
        response, address = await self.call(
            wanted[0].topic, broker_name, command, f"lock {len(wanted)} queues of {broker_name}"
        )
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        try:
            granted = json.loads(response.body or b"{}").get("lockOKMQSet") or []
            return {
                MessageQueue(str(q["topic"]), str(q["brokerName"]), int(q["queueId"]))
                for q in granted
            }
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise MQBrokerError(response.code, f"unreadable lock answer: {err}", address) from None

    async def unlock(
        self, group: str, client_id: str, broker_name: str, queues: Iterable[MessageQueue]
    ) -> None:
        wanted = sorted(queues)
        if not wanted:
            return
        body = {
            "consumerGroup": group,
            "clientId": client_id,
            "mqSet": [q.as_json() for q in wanted],
        }
        command = RemotingCommand.request(
            RequestCode.UNLOCK_BATCH_MQ, {}, json.dumps(body).encode()
        )
        response, address = await self.call(
            wanted[0].topic, broker_name, command, f"unlock {len(wanted)} queues of {broker_name}"
        )
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)

    async def send_back(
        self, group: str, message: MessageExt, *, delay_level: int, max_reconsume_times: int
    ) -> int | None:
        """CONSUMER_SEND_MSG_BACK: a broker that takes it re-stores the message in
        %RETRY%<group> for a later delivery. The answer's code (SUCCESS when taken;
        REQUEST_CODE_NOT_SUPPORTED from a broker that does not serve it), or None
        when no replica answered."""
        header = ConsumerSendMsgBackRequestHeader(
            offset=message.commit_log_offset,
            group=group,
            delay_level=delay_level,
            origin_msg_id=message.msg_id,
            origin_topic=message.topic,
            unit_mode=False,
            max_reconsume_times=max_reconsume_times,
        )
        command = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header.encode())
        try:
            response, _ = await self.call(
                message.queue.topic,
                message.queue.broker_name,
                command,
                f"send back {message.msg_id}",
                accept={ResponseCode.SUCCESS},
            )
        except MQBrokerError as err:
            log.debug("%s", err)
            return err.code
        except (BrokerUnreachable, NoRouteError) as err:
            log.debug("%s", err)
            return None
        return response.code

    async def unregister(self, group: str, client_id: str) -> None:
        """UNREGISTER_CLIENT to every broker address we know; failures are logged."""
        header = UnregisterClientRequestHeader(
            client_id=client_id, producer_group="", consumer_group=group
        )
        command = RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, header.encode())

        async def one(address: str) -> None:
            try:
                await self.instance.request(address, command, REQUEST_TIMEOUT_S)
            except TRANSPORT_FAILURES as err:
                log.debug("unregister %s at %s: %s", client_id, address, describe(err))

        async with trio.open_nursery() as nursery:
            for address in sorted(self.instance.all_broker_addresses()):
                nursery.start_soon(one, address)


def _offset_order(offset: int | None) -> int:
    """None (no offset stored) orders before every offset."""
    return -1 if offset is None else offset
