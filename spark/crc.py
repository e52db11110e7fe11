"""CRC-32 (zlib's, the IEEE polynomial) over many entries at once, without a call per entry.

- `crc32_rows`: the CRC of every row of a byte matrix, in numpy steps (the entry headers).
- `run_intact`: whether every entry of a run of back-to-back entries in a window has the
  header CRC and the body CRC its header states, from two ISA-L passes over the run's bytes
  instead of a Python call per body (~0.4 us per 1 KiB entry here, against ~0.75 us for
  the table-driven header CRCs and a call per body).

How `run_intact` can tell. Let R(s, m) be the CRC register after message m from state s;
zlib's crc32(m) = ~R(~0, m). L(m) = R(0, m) is linear over GF(2), and R(s, m) = Z_len(m)(s) xor
L(m), where Z_k (k zero bytes) is linear and invertible. So for an entry e = h || b (header h
of 44 bytes, body b of n bytes):

    L(e) = Z_n(L(h)) xor L(b)
    L(b) = ~crc32(b) xor Z_n(~0)
    L(h) = C xor W(c xor bswap(c))   where c = crc32(h[:40]), C = L(p || le32(crc32(p))) for
                                     any p (the CRC residue: a constant), and W = L of 4 bytes

(the header stores c big-endian; little-endian it would be the residue alone). An intact entry
therefore has the L of a buffer that is zero but for 4 bytes v = W^-1(C xor ~0) xor c xor
bswap(c) where its header CRC is and 4 bytes W^-1(~body_crc) at its end, both from the header's
own fields. L of back-to-back entries combines them by Z_len of what follows, so the run is
intact exactly when L(run) equals L of that sparse buffer, except that damage in two or more
entries can cancel: with probability 2^-32 for random damage, the odds CRC-32 itself has of
missing one. On a False the caller checks every entry on its own (and names the bad ones).
"""

from __future__ import annotations

import threading
import zlib

import numpy as np
from isal import isal_zlib

from spark import formats

MASK = 0xFFFFFFFF


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1)
    return table.astype(np.uint32)


CRC_TABLE = _crc_table()  # the reflected IEEE polynomial, as zlib.crc32 uses
assert int(CRC_TABLE[1]) == 0x77073096


def _word_tables() -> tuple[np.ndarray, np.ndarray]:
    """Slicing-by-4 (Intel's CRC tables T0..T3, T[k][b] = byte b followed by k zero bytes)
    folded pairwise into two tables of 2^16: a CRC xored with the next 4 little-endian bytes
    steps to LOW[its low 16 bits] ^ HIGH[its high 16 bits]."""
    tables = [CRC_TABLE]
    for _ in range(3):
        tables.append((tables[-1] >> 8) ^ CRC_TABLE[tables[-1] & 0xFF])
    t0, t1, t2, t3 = tables
    half = np.arange(1 << 16, dtype=np.uint32)
    low, high = half & 0xFF, half >> 8
    return t3[low] ^ t2[high], t1[low] ^ t0[high]


CRC_WORD_LOW, CRC_WORD_HIGH = _word_tables()  # 2 x 256 KiB


def word_step(words: np.ndarray) -> np.ndarray:
    """W: L (the register from state 0) of 4 bytes, given as little-endian uint32 words."""
    return CRC_WORD_LOW[words & 0xFFFF] ^ CRC_WORD_HIGH[words >> 16]


def crc32_rows(rows: np.ndarray) -> np.ndarray:
    """zlib.crc32 of every row of an n x k uint8 matrix: k/4 numpy steps of two lookups each
    (then one per byte left over), no loop per entry."""
    n, k = rows.shape
    words = k // 4
    crc = np.full(n, MASK, dtype=np.uint32)
    if words:  # column-major words, so that every step reads a contiguous column
        columns = np.ascontiguousarray(rows[:, : words * 4]).view("<u4").T.copy()
        for word in columns:
            crc = word_step(crc ^ word)
    for column in range(words * 4, k):
        crc = CRC_TABLE[(crc ^ rows[:, column]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(MASK)


def _inverse_tables() -> tuple[np.ndarray, np.ndarray]:
    """W^-1 as two 2^16 tables, as W's: W is linear and invertible on 32 bits, so its inverse
    is the matrix inverse over GF(2) of its images of the 32 unit words."""
    images = word_step(np.array([1 << j for j in range(32)], dtype=np.uint32)).tolist()
    pivots: dict[int, tuple[int, int]] = {}  # leading bit -> (image, preimage), reduced
    for j, image in enumerate(images):
        pre = 1 << j
        for bit in range(31, -1, -1):
            if not image >> bit & 1:
                continue
            if bit not in pivots:
                pivots[bit] = (image, pre)
                break
            image ^= pivots[bit][0]
            pre ^= pivots[bit][1]
    assert len(pivots) == 32, "W is invertible"
    inverse = []  # inverse[k] = the word whose W is the unit word 1 << k
    for k in range(32):
        image, pre = pivots[k]
        for bit in range(k - 1, -1, -1):  # clear the lower bits with the lower pivots
            if image >> bit & 1:
                low_image, low_pre = pivots[bit]
                image ^= low_image
                pre ^= low_pre
        pivots[k] = (image, pre)
        inverse.append(pre)
    half = np.arange(1 << 16, dtype=np.uint32)
    tables = []
    for first in (0, 16):
        table = np.zeros(1 << 16, dtype=np.uint32)
        for j in range(16):
            table ^= np.where(half >> j & 1, np.uint32(inverse[first + j]), np.uint32(0))
        tables.append(table)
    return tables[0], tables[1]


INVERSE_LOW, INVERSE_HIGH = _inverse_tables()


def word_step_inverse(values: np.ndarray) -> np.ndarray:
    """W^-1: the little-endian 4-byte words whose L are `values`."""
    return INVERSE_LOW[values & 0xFFFF] ^ INVERSE_HIGH[values >> 16]


def _l(data: bytes | memoryview) -> int:
    """L: the CRC register after `data` from state 0 (zlib's value ~0 starts there)."""
    return isal_zlib.crc32(data, MASK) ^ MASK


_PREFIX = bytes(formats.ENTRY_HEADER_CRC_BYTES)
RESIDUE = _l(_PREFIX + zlib.crc32(_PREFIX).to_bytes(4, "little"))  # C, the same for every prefix
HEADER_WORD = int(word_step_inverse(np.array([RESIDUE ^ MASK], dtype=np.uint32))[0])
BODY_BYTES_MIN = 4  # a shorter body would share bytes with its header's word in the buffer
_FOUR = np.arange(4)


def run_intact(
    window: np.ndarray,
    offsets: np.ndarray,
    sizes: np.ndarray,
    header_crcs: np.ndarray,
    body_crcs: np.ndarray,
) -> bool:
    """True when the entries at `offsets` of `window` (uint8) with these sizes (header + body)
    and stated CRCs lie back to back, each with a body of at least BODY_BYTES_MIN bytes, and
    every header CRC and body CRC holds (see the module docstring for the odds). False when
    any fails, or the entries are not such a run: the caller then checks each entry."""
    if len(offsets) == 0:
        return True
    offsets = offsets.astype(np.int64)
    ends = offsets + sizes.astype(np.int64)
    if (
        (sizes < formats.ENTRY_HEADER_BYTES + BODY_BYTES_MIN).any()
        or (offsets[1:] != ends[:-1]).any()
        or offsets[0] < 0
        or ends[-1] > len(window)
    ):
        return False
    lo, hi = int(offsets[0]), int(ends[-1])
    header_crc = header_crcs.astype(np.uint32)
    words = np.empty((len(offsets), 2), dtype="<u4")  # as the bytes lie
    words[:, 0] = np.uint32(HEADER_WORD) ^ header_crc ^ header_crc.byteswap()
    words[:, 1] = word_step_inverse(~body_crcs.astype(np.uint32))
    at = np.empty((len(offsets), 2), dtype=np.int64)
    at[:, 0] = offsets - lo + formats.ENTRY_HEADER_CRC_BYTES  # where the header CRC is
    at[:, 1] = ends - lo - 4  # the body's last 4 bytes
    where = (at[:, :, None] + _FOUR).reshape(-1)
    sparse = _zeros(hi - lo)
    sparse[where] = words.view(np.uint8).reshape(-1)
    try:
        return _l(window[lo:hi].data) == _l(sparse.data)
    finally:
        sparse[where] = 0


_scratch = threading.local()


def _zeros(n: int) -> np.ndarray:
    """n zero bytes from this thread's scratch buffer, which the caller zeroes again after
    use: a fresh zeroed buffer of megabytes costs a page fault per 4 KiB on every window."""
    buffer: np.ndarray | None = getattr(_scratch, "buffer", None)
    if buffer is None or len(buffer) < n:
        size = n if buffer is None else max(n, 2 * len(buffer))
        buffer = _scratch.buffer = np.zeros(size, dtype=np.uint8)
    return buffer[:n]
