"""SEND_BATCH_MESSAGE bodies: the splitter that cuts a list of messages into batches, and the
record format the messages of one batch are concatenated in (docs/formats.md#batch-body has
the same table; change both or neither).

A batch body is these records back to back (MessageDecoder.encodeMessage in RocketMQ 4.x):

    #  off len field              meaning
    #    0   4 total_size         this record, in bytes: 20 + n + 2 + p
    #    4   4 magic              0: the Java 4.x client and the C++ client write 0 here and
    #    8   4 body_crc           0:   no broker reads either (it computes its own CRC on store)
    #   12   4 flag               the message's user flag
    #   16   4 body_length        n
    #   20   n body               never compressed: the header's sys flag covers every record
    # 20+n   2 properties_length  p, int16 (<= 32767)
    #        p properties         key \\x01 value \\x02 ... (remoting/properties.py)

The splitter sizes a message as RocketMQ's does: topic + body + every property's key and value
+ 20 bytes of log overhead; one batch holds at most 4 MiB so sized, and at most 1024 messages
(our broker appends one batch at once and bounds it so). A message that alone is over 4 MiB
cannot be sent in a batch.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from client import limits
from client.errors import InvalidMessage

RECORD_HEAD = struct.Struct(">iiiii")  # total_size, magic, body_crc, flag, body_length
PROPERTIES_LENGTH = struct.Struct(">h")
assert RECORD_HEAD.size == 20 and PROPERTIES_LENGTH.size == 2


def message_size(topic: str, body: bytes, properties: Mapping[str, str]) -> int:
    """A message's size as the splitter counts it (UTF-8 bytes where Java counts chars)."""
    size = len(topic.encode()) + len(body) + limits.BATCH_LOG_OVERHEAD_BYTES
    for key, value in properties.items():
        size += len(key.encode()) + len(value.encode())
    return size


def encoded_message_size(topic: str, body: bytes, encoded: bytes, pairs: int) -> int:
    """message_size from the properties as remoting.properties.encode gave them (`pairs`
    of them, each "key\x01value\x02"), without encoding every key and value again."""
    return (
        len(topic.encode()) + len(body) + limits.BATCH_LOG_OVERHEAD_BYTES + len(encoded) - 2 * pairs
    )


def split(
    sizes: Sequence[int],
    *,
    bytes_max: int = limits.BATCH_BYTES_MAX,
    messages_max: int = limits.BATCH_MESSAGES_MAX,
) -> list[range]:
    """Cut messages of these sizes, in order, into batches: the index ranges of each. Raises
    InvalidMessage for a message that alone is over `bytes_max`."""
    batches: list[range] = []
    start = 0
    total = 0
    for i, size in enumerate(sizes):
        if size > bytes_max:
            raise InvalidMessage(
                "batch",
                f"message {i} is {size} bytes as the batch splitter counts them (topic, body, "
                f"properties and {limits.BATCH_LOG_OVERHEAD_BYTES} bytes of overhead), over "
                f"the {bytes_max} byte limit of one batch; send it on its own",
            )
        if i > start and (total + size > bytes_max or i - start >= messages_max):
            batches.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        batches.append(range(start, len(sizes)))
    return batches


def encode_record(body: bytes, flag: int, properties: bytes) -> bytes:
    """One message of a batch body."""
    total = RECORD_HEAD.size + len(body) + PROPERTIES_LENGTH.size + len(properties)
    assert len(properties) <= 0x7FFF, len(properties)  # remoting/properties.py bounds it
    return b"".join(
        (
            RECORD_HEAD.pack(total, 0, 0, flag, len(body)),
            body,
            PROPERTIES_LENGTH.pack(len(properties)),
            properties,
        )
    )


def encode(records: Sequence[tuple[bytes, int, bytes]]) -> bytes:
    """A batch body from (body, flag, properties) of each message, in order."""
    return b"".join(encode_record(body, flag, properties) for body, flag, properties in records)
