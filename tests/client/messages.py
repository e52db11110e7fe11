"""MessageExt values for the client's unit tests, without a broker."""

from __future__ import annotations

from client.message import MessageExt, MessageQueue
from remoting import properties as props


def message(
    queue: MessageQueue, offset: int, body: bytes = b"x", tags: str | None = None
) -> MessageExt:
    properties = {props.UNIQ_KEY: f"ID-{queue}-{offset}"}
    if tags is not None:
        properties[props.TAGS] = tags
    return MessageExt(
        topic=queue.topic,
        body=body,
        properties=properties,
        queue=queue,
        queue_offset=offset,
        commit_log_offset=1000 + offset,
        msg_id=properties[props.UNIQ_KEY],
        offset_msg_id=f"{offset:032X}",
        born_timestamp_ms=0,
        store_timestamp_ms=0,
        born_host="127.0.0.1:1",
        store_host="127.0.0.1:2",
        reconsume_times=0,
        sys_flag=0,
        flag=0,
    )
