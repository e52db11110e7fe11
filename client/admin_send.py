"""`mqadmin sendMessage`: one SEND_MESSAGE_V2, just enough for an operator's test message.

Applications use the Producer (client/producer.py), which retries, tracks faults and picks
queues properly; this belongs there once it exists (Producer.send with a chosen queue), and is
kept apart so it can move in one piece.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import trio

from client.admin_results import SentMessage
from client.errors import BrokerUnreachable, MQBrokerError, MQClientError, SendOutcomeUnknown
from client.message import Message, MessageQueue, compress_body
from remoting import properties as props
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import ConnectionClosed, MessageFormatError, RequestTimeout
from remoting.headers import SendMessageRequestHeader, SendMessageResponseHeader

if TYPE_CHECKING:
    from client.admin import Admin

TOOLS_PRODUCER_GROUP = "TOOLS_PRODUCER"
SEND_TIMEOUT_S = 10.0  # the broker answers within its own 3 s write timeout


async def send(
    admin: Admin,
    topic: str,
    body: bytes,
    keys: str | None,
    tags: str | None,
    broker_name: str | None,
    queue_id: int | None,
) -> SentMessage:
    """One SEND_MESSAGE_V2 to a write queue of `topic` (the given one, or one at random),
    through its group's master, or another replica when the master cannot be reached (it
    forwards to the leader). A connection that fails after the request went out raises
    SendOutcomeUnknown: the message may be stored."""
    route = await admin.topic_route(topic)
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
    queue = random.choice(queues)
    uniq_key = admin.instance.uniq_ids.next_id()
    message = Message(topic, body, tags=tags or None, keys=keys or None)
    data, sys_flag = compress_body(message.body)
    try:
        properties = props.encode(message.wire_properties(uniq_key)).decode()
    except MessageFormatError as err:
        raise MQClientError(f"cannot send: {err}") from None
    header = SendMessageRequestHeader(
        producer_group=TOOLS_PRODUCER_GROUP,
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue.queue_id,
        sys_flag=sys_flag,
        born_timestamp=time.time_ns() // 1_000_000,
        flag=0,
        properties=properties,
        reconsume_times=0,
        unit_mode=False,
        batch=False,
    ).encode(short_names=True)
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header, data)
    group = route.broker(queue.broker_name)
    assert group is not None  # write_queues() lists only queues of brokers in the route
    causes = []
    for address in group.addresses():
        try:
            response = await admin.instance.request(address, request, SEND_TIMEOUT_S)
        except (ConnectionClosed, RequestTimeout) as err:
            raise SendOutcomeUnknown(topic, uniq_key, f"{address}: {err}") from None
        except (OSError, trio.TooSlowError) as err:  # not connected: nothing was sent
            causes.append(f"{address}: {err or 'connect timed out'}")
            continue
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        answer = SendMessageResponseHeader.decode(response.ext_fields)
        return SentMessage(
            MessageQueue(topic, queue.broker_name, answer.queue_id),
            answer.queue_offset,
            uniq_key,
            answer.msg_id,
        )
    raise BrokerUnreachable(f"send to {topic} on {queue.broker_name}", causes)
