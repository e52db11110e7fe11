"""Every bound of the broker's storage formats, in one place, unit last, with its reason.

The numbers that are RocketMQ's own are RocketMQ 4.9.4's defaults, so files and messages stay
compatible with what RocketMQ tools and clients expect; tests pass smaller geometries.
"""

from __future__ import annotations

from dledger import limits as dledger_limits

KiB, MiB = 1 << 10, 1 << 20

# --- stored message (docs/formats.md#stored-message) -------------------------------------------
# RocketMQ's maxMessageSize (4 MiB) bounds the whole stored record in its CommitLog; here the
# record is the body of one log entry, so it must also fit the log's entry body limit.
STORED_MESSAGE_BYTES_MAX = 4 * MiB
PROPERTIES_BYTES_MAX = 32767  # the stored length is a signed int16 (Java reads getShort())
TOPIC_BYTES_MAX_V1 = 127  # V1 stores the topic length in one byte that Java reads as signed
TOPIC_BYTES_MAX_V2 = 32767  # V2 stores it in a signed int16

# --- ConsumeQueue (docs/formats.md#consumequeue) --------------------------------------------------
CQ_UNIT_BYTES = 20  # physical offset int64, size int32, tag hash int64
CQ_UNITS_PER_FILE_DEFAULT = 300_000  # RocketMQ's mappedFileSizeConsumeQueue: 6,000,000 bytes

# --- IndexFile (docs/formats.md#indexfile) -----------------------------------------------------------
INDEX_HEADER_BYTES = 40
INDEX_SLOT_BYTES = 4
INDEX_ITEM_BYTES = 20
INDEX_SLOTS_DEFAULT = 5_000_000  # RocketMQ's maxHashSlotNum
INDEX_ITEMS_DEFAULT = 20_000_000  # RocketMQ's maxIndexNum: a file of 420,000,040 bytes (sparse)
INDEX_QUERY_COUNT_MAX = 64 * KiB  # one query by key returns at most this many positions

assert STORED_MESSAGE_BYTES_MAX <= dledger_limits.ENTRY_BODY_BYTES_MAX  # one message, one entry
assert PROPERTIES_BYTES_MAX == (1 << 15) - 1
assert TOPIC_BYTES_MAX_V1 == (1 << 7) - 1
assert CQ_UNITS_PER_FILE_DEFAULT * CQ_UNIT_BYTES == 6_000_000
assert (
    INDEX_HEADER_BYTES
    + INDEX_SLOTS_DEFAULT * INDEX_SLOT_BYTES
    + INDEX_ITEMS_DEFAULT * INDEX_ITEM_BYTES
    == 420_000_040
)
