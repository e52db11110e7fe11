"""What the client's integration tests do to a real cluster besides consuming: create topics
and send messages with raw SEND_MESSAGE requests (the producer is not used here, so these tests
depend on the consumers alone). A send goes to any replica of the queue's group (followers
forward it to the leader) and is retried on every replica until it succeeds or its deadline
passes, keeping its UNIQ_KEY, so a consumer dedupes a send retried after an unknown outcome."""

from __future__ import annotations

import time

import attrs
import trio

from broker.localcluster import LocalCluster
from client.instance import TRANSPORT_FAILURES, ClientInstance
from client.message import MessageQueue
from remoting import properties as props
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.headers import SendMessageRequestHeader, SendMessageResponseHeader

SEND_TIMEOUT_S = 30.0
ATTEMPT_TIMEOUT_S = 3.0
RETRY_PAUSE_S = 0.05
REFUSALS_TO_RETRY = {
    ResponseCode.SYSTEM_BUSY,
    ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.SYSTEM_ERROR,
    ResponseCode.TOPIC_NOT_EXIST,  # a replica that has not applied the topic yet
}


async def create_topic(
    instance: ClientInstance, cluster: LocalCluster, topic: str, queues: int
) -> list[MessageQueue]:
    """The topic on every group, with `queues` queues each; returns its queues once the name
    server routes them all."""
    fields = {
        "topic": topic,
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": "6",
    }
    request = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
    for group in cluster.groups:
        causes = []
        for address in cluster.broker_addresses(group):  # any replica forwards it
            try:
                response = await instance.request(address, request, 10.0)
            except TRANSPORT_FAILURES as err:
                causes.append(f"{address}: {err!r}")
                continue
            assert response.code == ResponseCode.SUCCESS, response.remark
            break
        else:
            raise AssertionError(f"no replica of {group} created {topic}: {causes}")
    with trio.fail_after(30):
        while True:
            route = await instance.refresh(topic, force=True)
            if route is not None and len(route.read_queues()) == queues * len(cluster.groups):
                return route.read_queues()
            await trio.sleep(0.1)


async def restart(cluster: LocalCluster, name: str, timeout_s: float = 60.0) -> None:
    """Start a killed process again and return once it answers (the next test needs it)."""
    cluster.start(name)
    await wait_answering(cluster, name, timeout_s)


async def wait_answering(cluster: LocalCluster, name: str, timeout_s: float = 60.0) -> None:
    with trio.fail_after(timeout_s):
        while await trio.to_thread.run_sync(cluster.runtime_info, name) is None:
            await trio.sleep(0.1)


@attrs.frozen
class Sent:
    queue: MessageQueue
    queue_offset: int
    uniq_key: str
    body: bytes


async def send(
    instance: ClientInstance,
    queue: MessageQueue,
    body: bytes,
    *,
    tags: str | None = None,
    keys: str | None = None,
    timeout_s: float = SEND_TIMEOUT_S,
) -> Sent:
    uniq_key = instance.uniq_ids.next_id()
    properties = {props.UNIQ_KEY: uniq_key, props.WAIT: "true"}
    if tags:
        properties[props.TAGS] = tags
    if keys:
        properties[props.KEYS] = keys
    header = SendMessageRequestHeader(
        producer_group="test_client_pg",
        topic=queue.topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue.queue_id,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=props.encode(properties).decode(),
        reconsume_times=0,
        unit_mode=False,
    )
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE, header.encode(), body)
    causes: list[str] = []
    with trio.fail_after(timeout_s):
        while True:
            for address in instance.broker_addresses(queue.broker_name):
                try:
                    response = await instance.request(address, request, ATTEMPT_TIMEOUT_S)
                except TRANSPORT_FAILURES as err:
                    causes.append(f"{address}: {err!r}")
                    continue
                if response.code == ResponseCode.SUCCESS:
                    offset = SendMessageResponseHeader.decode(response.ext_fields).queue_offset
                    return Sent(queue, offset, uniq_key, body)
                assert response.code in REFUSALS_TO_RETRY, (response.code, response.remark)
                causes.append(f"{address}: {response.code} {response.remark}")
            del causes[:-6]
            await instance.refresh(queue.topic)
            await trio.sleep(RETRY_PAUSE_S)
