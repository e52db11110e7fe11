"""Every bound of the broker's storage formats, in one place, unit last, with its reason.

The numbers that are RocketMQ's own are RocketMQ 4.9.4's defaults, so files and messages stay
compatible with what RocketMQ tools and clients expect; tests pass smaller geometries.
"""

from __future__ import annotations

from dledger import limits as dledger_limits
from remoting import limits as remoting_limits

KiB, MiB = 1 << 10, 1 << 20

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

# a stored message (remoting/limits.py) is the body of one log entry
assert remoting_limits.STORED_MESSAGE_BYTES_MAX <= dledger_limits.ENTRY_BODY_BYTES_MAX
assert CQ_UNITS_PER_FILE_DEFAULT * CQ_UNIT_BYTES == 6_000_000
assert (
    INDEX_HEADER_BYTES
    + INDEX_SLOTS_DEFAULT * INDEX_SLOT_BYTES
    + INDEX_ITEMS_DEFAULT * INDEX_ITEM_BYTES
    == 420_000_040
)
