"""What a send returns: `SendResult` with a `SendStatus`, as RocketMQ's client names them."""

from __future__ import annotations

import enum

import attrs

from client.message import MessageQueue
from remoting.codes import ResponseCode


class SendStatus(enum.Enum):
    """RocketMQ's SendStatus. Every status but SEND_OK means "stored, but not as durable as the
    broker was configured to make it" (a Java master-slave broker's flush or replication missed
    its deadline); the message is in the log and is not sent again."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


# The answers that mean "stored": a send ends with one of these and is never retried
# (RocketMQ's retryAnotherBrokerWhenNotStoreOK is false by default).
STORED_CODES: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


@attrs.frozen
class SendResult:
    """One stored message, or one stored batch.

    `msg_id` is the message's UNIQ_KEY (what a consumer sees as MessageExt.msg_id);
    `offset_msg_id` the broker's id of where it is stored (store host and physical offset).
    For a batch both are comma-joined, one per message in order, as the Java client does, and
    `queue_offset` is the first message's.
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.SEND_OK
