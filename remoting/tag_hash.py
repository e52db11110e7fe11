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
# share their first 20 hex digits (address, pid, a random), then come 8 of the time in ms and 4
# of a counter. The hash is linear: hash(head + tail) = hash(head) * 31^len(tail) + hash(tail),
# mod 2^32. So the hash of all but the last TAIL characters is remembered (a producer's), and
# that of all but the last COUNTER (the keys of one millisecond: most keys of a batch), leaving
# four characters to add for most keys. Products of weights above 2^30 make Python multiply
# big integers: the twelve-character tail alone cost 640 ns, four cost 90.
_TAIL = 12
_COUNTER = 4
_MID = _TAIL - _COUNTER
_MID_POWER = pow(31, _MID, 1 << 32)
_MID_WEIGHTS = tuple(31 ** (_MID - 1 - k) for k in range(_MID))
_COUNTER_POWER = 31**_COUNTER
HEADS_MAX = 4096
NEARS_MAX = 256
_heads: dict[bytes, int] = {}
_nears: dict[bytes, int] = {}


def _units_hash(units: Iterable[int]) -> int:
    h = 0
    for unit in units:
        h = (31 * h + unit) & _MASK
    return h


def java_string_hash(text: str) -> int:
    """String.hashCode() of `text`: a signed 32-bit int."""
    if text.isascii():
        h = _ascii_hash(text.encode())
    else:
        h = _units_hash(memoryview(text.encode(_UTF16)).cast("H"))
    return h - (1 << 32) if h & 0x80000000 else h


def _ascii_hash(data: bytes) -> int:
    """The hash of ASCII `data` (one UTF-16 unit per byte), unsigned: 0 <= h < 2^32."""
    if len(data) <= 2 * _TAIL:
        return _units_hash(data)
    near = data[:-_COUNTER]
    h = _nears.get(near, -1)
    if h < 0:
        head = data[:-_TAIL]
        h = _heads.get(head, -1)
        if h < 0:
            h = _units_hash(head)
            if len(_heads) >= HEADS_MAX:
                _heads.clear()
            _heads[head] = h
        h = (h * _MID_POWER + sum(map(mul, near[-_MID:], _MID_WEIGHTS))) & _MASK
        if len(_nears) >= NEARS_MAX:
            _nears.clear()
        _nears[near] = h
    # the last _COUNTER (4) characters, by Horner's rule on small integers
    counter = ((data[-4] * 31 + data[-3]) * 31 + data[-2]) * 31 + data[-1]
    return (h * _COUNTER_POWER + counter) & _MASK


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


def index_key_hash_utf8(key: bytes) -> int:
    """index_key_hash of the string whose UTF-8 encoding is `key`, without making the string:
    the dispatcher's path, which has every message's "topic#UNIQ_KEY" as bytes. Invalid UTF-8
    hashes as decode(errors="replace") makes it, as a key read from a record does."""
    if not key.isascii():
        return index_key_hash(key.decode(errors="replace"))
    h = _ascii_hash(key)  # abs of the signed value, from the unsigned one:
    return h if h < 0x80000000 else (0 if h == 0x80000000 else (1 << 32) - h)
