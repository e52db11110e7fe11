"""Java's String.hashCode, as RocketMQ uses it for ConsumeQueue tag hashes and IndexFile keys.

    s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1]      over UTF-16 code units, in int32 arithmetic

Characters outside the BMP count as their two surrogates, as in Java. Every replica computes the
same value from the same string, so the derived files agree.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from operator import mul

_UTF16 = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"  # native order for cast("H")
_MASK = 0xFFFFFFFF

# Every replica hashes each message's "topic#UNIQ_KEY" for the IndexFile. A producer's UNIQ_KEYs
# share their first 20 hex digits (address, pid, a random) and differ in the last 12 (time and a
# counter), so the hash of all but the last TAIL characters is remembered: hash(head + tail) =
# hash(head) * 31^len(tail) + hash(tail), mod 2^32. A third of the time of the whole loop.
_TAIL = 12
_TAIL_POWER = pow(31, _TAIL, 1 << 32)
_TAIL_WEIGHTS = tuple(31 ** (_TAIL - 1 - k) for k in range(_TAIL))  # the tail's sum in C: -30 %
HEADS_MAX = 4096
_heads: dict[bytes, int] = {}


def _units_hash(units: Iterable[int]) -> int:
    h = 0
    for unit in units:
        h = (31 * h + unit) & _MASK
    return h


def java_string_hash(text: str) -> int:
    """String.hashCode() of `text`: a signed 32-bit int."""
    if not text.isascii():
        h = _units_hash(memoryview(text.encode(_UTF16)).cast("H"))
    elif len(text) <= 2 * _TAIL:
        h = _units_hash(text.encode())
    else:
        data = text.encode()
        head = data[:-_TAIL]
        h = _heads.get(head, -1)
        if h < 0:
            h = _units_hash(head)
            if len(_heads) >= HEADS_MAX:
                _heads.clear()
            _heads[head] = h
        tail = sum(map(mul, data[-_TAIL:], _TAIL_WEIGHTS))  # < 2^64: no masking needed
        h = (h * _TAIL_POWER + tail) & _MASK
    return h - (1 << 32) if h & 0x80000000 else h


@functools.lru_cache(maxsize=4096)  # an application uses a few tags over and over
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
