"""A stored message by its physical offset, from this replica's own log (RocketMQ's
lookMessageByOffset), for requests that name one: CONSUMER_SEND_MSG_BACK and END_TRANSACTION.

A client may send such a request to any replica right after the message was stored through
another one, so a message this replica has not stored or applied yet is waited for, briefly.
"""

from __future__ import annotations

import attrs
import trio

from broker.entries import EntryType, entry_type
from broker.state import HEADER_BYTES, BrokerState
from dledger.log.errors import LogError
from remoting import stored_message
from remoting.errors import MessageFormatError

LOOKUP_WAIT_S = 3.0  # a message this replica has not applied yet is waited for this long


@attrs.define
class LookupFailed(Exception):
    """No message this replica has applied starts at the offset; `reason` says why."""

    physical_offset: int
    reason: str

    def __str__(self) -> str:
        return f"look message by offset failed, {self.physical_offset} ({self.reason})"


async def message_at(state: BrokerState, physical_offset: int) -> stored_message.StoredMessage:
    """The stored message at `physical_offset`, waiting up to LOOKUP_WAIT_S for one this
    replica has not stored or applied yet. Raises LookupFailed."""
    deadline = trio.current_time() + LOOKUP_WAIT_S
    await state.read_in_records([physical_offset])
    while True:
        why = "no entry starts there"
        position = physical_offset - HEADER_BYTES
        try:
            if position < state.store.next_position:
                entry = state.store.get_at(position)
                if entry.index <= state.applied_index:
                    if entry_type(entry.body) is not EntryType.MESSAGE:
                        raise LookupFailed(physical_offset, "not a message")
                    return stored_message.decode(entry.body)
                why = f"its entry {entry.index} is not applied yet"
            else:
                why = "past the end of this replica's log"
        except (LogError, MessageFormatError) as err:
            raise LookupFailed(physical_offset, str(err)) from err
        if trio.current_time() >= deadline:
            raise LookupFailed(physical_offset, why)
        with trio.move_on_at(deadline):
            await state.wait_applied(state.applied_index + 1)
