"""END_TRANSACTION (37): a producer commits or rolls back a half message, RocketMQ's
EndTransactionProcessor (docs/protocol.md#transactional-messages).

The Java client sends it one-way to the master of the group that stored the half, after its
local transaction or after a CHECK_TRANSACTION_STATE; it may reach any replica. That replica
reads the half at `commitLogOffset` from its own log (waiting briefly for one it has not applied
yet), checks it as RocketMQ's checkPrepareMessage does (the producer group, the half's queue
offset `tranStateTableOffset`, its physical offset), and writes through the leader:

- commit (0x8): the half's copy in its real topic (broker/transactions.py committed_record),
  which is also what resolves the half when applied;
- rollback (0xC): a "txn_end" metadata entry;
- 0 (the producer's UNKNOWN): nothing; the leader's checks go on (broker/transaction_check.py).

A half that is resolved already (a second END_TRANSACTION, a commit after a rollback, an end
after the discard) changes nothing: this replica answers at once when it has applied the first
resolution, and otherwise the leader's shaper voids a second commit and a second "txn_end"
changes nothing when applied (broker/shaped_once.py). A one-way request's answer is dropped;
the answers below are for a producer that waits for one.
"""

from __future__ import annotations

import logging
import time

from broker.context import Broker
from broker.lookup import LookupFailed, message_at
from broker.transactions import COMMIT, HALF_TOPIC, NOT_TYPE, ROLLBACK, resolution_entry
from broker.writes import WriteFailed, WriteUnknown
from remoting import properties as props
from remoting.codes import ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.errors import MessageFormatError
from remoting.headers import EndTransactionRequestHeader
from remoting.stored_message import StoredMessage

log = logging.getLogger("broker.end_transaction")

WRITE_TIMEOUT_S = 3.0  # as a send's
HOW_NAMES = {COMMIT: "commit", ROLLBACK: "rollback", NOT_TYPE: "unknown"}


async def handle_end_transaction(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = EndTransactionRequestHeader.decode(request.ext_fields)
    how = header.commit_or_rollback
    source = "a check" if header.from_transaction_check else "the producer"
    if how == NOT_TYPE:
        log.debug("transaction %s stays unknown (from %s)", header.transaction_id, source)
        return request.response(ResponseCode.SUCCESS)
    if how not in (COMMIT, ROLLBACK):
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"commitOrRollback {how} is none of 8 (commit), 12 (rollback) and 0 (unknown)",
        )
    try:
        half = await message_at(broker.state, header.commit_log_offset)
    except LookupFailed as err:
        return request.response(
            ResponseCode.SYSTEM_ERROR, f"Find prepared transaction message failed: {err}"
        )
    problem = mismatch(half, header)
    if problem is not None:
        return request.response(ResponseCode.SYSTEM_ERROR, problem)
    offset = half.queue_offset
    if broker.state.metadata.transactions.resolved(offset):
        log.info(
            "transaction %s (half %d) is resolved already: its %s from %s changes nothing",
            half.properties.get(props.UNIQ_KEY),
            offset,
            HOW_NAMES[how],
            source,
        )
        return request.response(ResponseCode.SUCCESS)
    try:
        entry = resolution_entry(half, how, broker.store_host, int(time.time() * 1000))
    except (ValueError, MessageFormatError) as err:
        return request.response(ResponseCode.MESSAGE_ILLEGAL, str(err))
    try:
        await broker.writes.append([entry], WRITE_TIMEOUT_S)
    except WriteFailed as err:
        return request.response(
            ResponseCode.SERVICE_NOT_AVAILABLE, f"service not available now: {err}"
        )
    except WriteUnknown as err:
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"outcome unknown (the {HOW_NAMES[how]} may be stored): {err}",
        )
    log.debug(
        "transaction %s (half %d): %s from %s",
        header.transaction_id,
        offset,
        HOW_NAMES[how],
        source,
    )
    return request.response(ResponseCode.SUCCESS)


def mismatch(half: StoredMessage, header: EndTransactionRequestHeader) -> str | None:
    """Why `half` is not the half message the request names (RocketMQ's checkPrepareMessage
    remarks), or None."""
    if half.topic != HALF_TOPIC:
        return f"the message at {half.physical_offset} is not a half message (its topic is {half.topic})"
    if half.properties.get(props.PGROUP) != header.producer_group:
        return "The producer group wrong"
    if half.queue_offset != header.tran_state_table_offset:
        return "The transaction state table offset wrong"
    if half.physical_offset != header.commit_log_offset:
        return "The commit log offset wrong"
    return None
