"""Java's String.hashCode, as RocketMQ uses it for ConsumeQueue tag hashes and IndexFile keys.

    s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1]      over UTF-16 code units, in int32 arithmetic

Characters outside the BMP count as their two surrogates, as in Java. Every replica computes the
same value from the same string, so the derived files agree.
"""

from __future__ import annotations

import sys

_UTF16 = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"  # native order for cast("H")
_MASK = 0xFFFFFFFF


def java_string_hash(text: str) -> int:
    """String.hashCode() of `text`: a signed 32-bit int."""
    units = text.encode() if text.isascii() else memoryview(text.encode(_UTF16)).cast("H")
    h = 0
    for unit in units:
        h = (31 * h + unit) & _MASK
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tag hash of a message's TAGS (MessageExtBrokerInner.tagsString2tagsCode):
    0 without tags, else the hashCode widened to a signed 64-bit long (so negative stays negative).

    (RocketMQ stores a delivery timestamp instead for messages with a delay level; that is the
    dispatcher's decision, not this function's.)
    """
    if not tags:
        return 0
    return java_string_hash(tags)


def index_key_hash(key: str) -> int:
    """IndexFile.indexKeyHashMethod: abs(hashCode), and 0 for Integer.MIN_VALUE (whose abs
    overflows to itself in Java)."""
    h = java_string_hash(key)
    return 0 if h == -(1 << 31) else abs(h)
