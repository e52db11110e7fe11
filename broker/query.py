"""Looking messages up: VIEW_MESSAGE_BY_ID (33) and QUERY_MESSAGE (12), RocketMQ's
QueryMessageProcessor.

Both answer from this replica's applied state: the physical offset of an offsetMsgId is a
position in the replicated log, the same on every replica, and the IndexFile is derived from
the applied log, so any replica finds a message once it has applied it. A position that holds
no message of the applied log (a metadata entry, an entry not applied yet, nothing at all, or
a deleted segment) is "not found", never another entry's bytes.
"""

from __future__ import annotations

import logging

from broker.context import Broker
from broker.entries import EntryType, entry_type
from broker.state import HEADER_BYTES
from dledger.log.errors import LogError
from remoting.codes import ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.headers import (
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
)

log = logging.getLogger("broker.query")

QUERY_MESSAGES_MAX = 64  # RocketMQ's maxMsgsNumBatch: one QUERY_MESSAGE answer at most
UNIQUE_KEY_QUERY_MESSAGES_MAX = 32  # RocketMQ's defaultQueryMaxNum, for a query by UNIQ_KEY
UNIQUE_KEY_QUERY_FIELD = "_UNIQUE_KEY_QUERY"  # extFields flag a Java client sets ("true")


def applied_record(broker: Broker, physical_offset: int) -> bytes | str:
    """The stored message at `physical_offset` if this replica has applied it, else why not."""
    state = broker.state
    try:
        entry = state.store.get_at(physical_offset - HEADER_BYTES)
    except LogError as err:
        return str(err)
    if entry.index > state.applied_index:
        return f"the entry there ({entry.index}) is not applied yet"
    if entry_type(entry.body) is not EntryType.MESSAGE:
        return "the entry there is not a message"
    return entry.body


async def handle_view_message(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = ViewMessageRequestHeader.decode(request.ext_fields)
    await broker.state.read_in_records([header.offset])
    found = applied_record(broker, header.offset)
    if isinstance(found, str):
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"can not find message by the offset, {header.offset} ({found})",
        )
    return request.response(ResponseCode.SUCCESS, body=found)


async def handle_query_message(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    """Messages of `topic` indexed under `key` stored within [beginTimestamp, endTimestamp],
    newest first, records back to back."""
    header = QueryMessageRequestHeader.decode(request.ext_fields)
    count_max = header.max_num
    if str(request.ext_fields.get(UNIQUE_KEY_QUERY_FIELD, "")).lower() == "true":
        count_max = UNIQUE_KEY_QUERY_MESSAGES_MAX
    count_max = max(0, min(count_max, QUERY_MESSAGES_MAX))
    index = broker.state.index
    offsets = index.query(
        header.topic, header.key, count_max, header.begin_timestamp, header.end_timestamp
    )
    await broker.state.read_in_records(offsets)
    records = []
    for physical_offset in offsets:
        found = applied_record(broker, physical_offset)
        if isinstance(found, str):  # deleted since it was indexed: skipped, as RocketMQ does
            log.debug(
                "query %s#%s: %d skipped: %s", header.topic, header.key, physical_offset, found
            )
            continue
        records.append(found)
    fields = QueryMessageResponseHeader(
        index_last_update_timestamp=index.end_timestamp_ms,
        index_last_update_phyoffset=max(index.end_phy_offset, 0),
    ).encode()
    if not records:
        return request.response(
            ResponseCode.QUERY_NOT_FOUND,
            f"can not find message by key {header.key!r} in topic {header.topic}, "
            "maybe time range not correct",
            fields,
        )
    return request.response(ResponseCode.SUCCESS, ext_fields=fields, body=b"".join(records))
