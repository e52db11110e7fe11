"""spark/crc.py: per-row CRCs and the whole-run check, against zlib and the log writer's
bytes, without a JVM."""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.log import entry
from spark import crc, formats
from tests.spark.stores import crc32_patch


def run_of(bodies: list[bytes], first_index: int = 1) -> tuple[np.ndarray, ...]:
    """The bytes of back-to-back entries as LogStore writes them, 8 zero bytes after them, and
    (offsets, sizes, header CRCs, body CRCs) as the reader parses them from the headers."""
    data, offsets = bytearray(), []
    for i, body in enumerate(bodies):
        offsets.append(len(data))
        data += entry.encode_entry(first_index + i, 1, len(data), 0, body)
    window = np.frombuffer(bytes(data) + bytes(8), dtype=np.uint8)
    at = np.array(offsets, dtype=np.int64)
    header = np.stack([window[o : o + formats.ENTRY_HEADER_BYTES] for o in offsets])
    parsed = header.view(formats.ENTRY_HEADER).reshape(-1)
    sizes = parsed["size"].astype(np.int64)
    return window, at, sizes, parsed["header_crc"], parsed["body_crc"]


def intact(window: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, *crcs: np.ndarray) -> bool:
    return crc.run_intact(window, offsets, sizes, *crcs)


def test_crc32_rows_matches_zlib() -> None:
    rng = np.random.default_rng(7)
    for n, width in ((50, formats.ENTRY_HEADER_CRC_BYTES), (9, 43), (5, 3), (4, 0), (0, 40)):
        rows = rng.integers(0, 256, size=(n, width), dtype=np.uint8)
        got = crc.crc32_rows(rows)
        assert got.dtype == np.uint32
        assert got.tolist() == [zlib.crc32(r.tobytes()) for r in rows], (n, width)
    # a strided view (columns of the wider header rows the parser slices) gives the same
    wide = rng.integers(0, 256, size=(20, formats.ENTRY_HEADER_BYTES), dtype=np.uint8)
    part = wide[:, : formats.ENTRY_HEADER_CRC_BYTES]
    assert crc.crc32_rows(part).tolist() == [zlib.crc32(r.tobytes()) for r in part]


def test_word_step_inverse_undoes_the_word_step() -> None:
    words = np.random.default_rng(3).integers(0, 1 << 32, 10_000, dtype=np.uint64)
    words = np.concatenate([words.astype(np.uint32), np.array([0, 1, 0xFFFFFFFF], np.uint32)])
    assert (crc.word_step(crc.word_step_inverse(words)) == words).all()
    assert (crc.word_step_inverse(crc.word_step(words)) == words).all()
    # the word step is the CRC register after 4 bytes from state 0
    for w in words[:50].tolist():
        assert (
            int(crc.word_step(np.uint32(w)))
            == zlib.crc32(w.to_bytes(4, "little"), 0xFFFFFFFF) ^ 0xFFFFFFFF
        )


def test_an_intact_run_is_intact_and_every_flipped_bit_is_found() -> None:
    bodies = [b"abcd", b"", b"\x00" * 4, bytes(range(37)), b"tail"]
    window, *parsed = run_of([b for b in bodies if len(b) >= crc.BODY_BYTES_MIN])
    assert intact(window, *parsed)
    end = int(parsed[0][-1] + parsed[1][-1])
    for at in range(end):  # every bit of every header and body
        for bit in range(8):
            damaged = window.copy()
            damaged[at] ^= 1 << bit
            assert not intact(damaged, *parsed), (at, bit)


def test_a_stated_crc_that_is_wrong_is_found() -> None:
    window, offsets, sizes, header_crcs, body_crcs = run_of([b"x" * 100, b"y" * 50, b"z" * 7])
    for k in range(3):
        for bit in (0, 13, 31):
            body_wrong = body_crcs.copy()
            body_wrong[k] ^= np.uint32(1 << bit)
            assert not intact(window, offsets, sizes, header_crcs, body_wrong)
            header_wrong = header_crcs.copy()
            header_wrong[k] ^= np.uint32(1 << bit)
            assert not intact(window, offsets, sizes, header_wrong, body_crcs)


def test_runs_it_cannot_judge_at_once_are_left_to_the_caller() -> None:
    window, offsets, sizes, h, b = run_of([b"a" * 10, b"b" * 3, b"c" * 10])
    assert not intact(window, offsets, sizes, h, b)  # a body under 4 bytes
    window, offsets, sizes, h, b = run_of([b"a" * 10, b"b" * 10, b"c" * 10])
    assert intact(window, offsets, sizes, h, b)
    assert not intact(window, offsets[[0, 2]], sizes[[0, 2]], h[[0, 2]], b[[0, 2]])  # a gap
    assert not intact(window[: int(offsets[2] + sizes[2]) - 1], offsets, sizes, h, b)  # cut
    assert not intact(window, offsets[::-1], sizes[::-1], h[::-1], b[::-1])  # out of order
    empty = np.zeros(0, dtype=np.int64)
    assert intact(window, empty, empty, empty, empty)  # nothing to judge: nothing wrong


def test_a_run_far_into_a_window_and_after_a_larger_one() -> None:
    """The scratch buffer is reused, and must be all zeros again for the next run."""
    big, *big_parsed = run_of([bytes([i]) * 3000 for i in range(40)])
    assert intact(big, *big_parsed)
    window, offsets, sizes, h, b = run_of([b"p" * 20, b"q" * 30, b"r" * 40])
    shifted = np.concatenate([np.full(1000, 0xAB, dtype=np.uint8), window])
    assert intact(shifted, offsets + 1000, sizes, h, b)
    assert intact(
        shifted[1000 + int(offsets[1]) :], offsets[1:] - offsets[1], sizes[1:], h[1:], b[1:]
    )


@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(st.binary(min_size=crc.BODY_BYTES_MIN, max_size=300), min_size=1, max_size=12),
    flip=st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
)
def test_random_runs_are_intact_until_one_bit_flips(
    bodies: list[bytes], flip: tuple[float, int]
) -> None:
    window, *parsed = run_of(bodies)
    assert intact(window, *parsed)
    end = int(parsed[0][-1] + parsed[1][-1])
    damaged = window.copy()
    damaged[int(flip[0] * end)] ^= 1 << flip[1]
    assert not intact(damaged, *parsed)


def test_a_forged_body_keeps_its_crc() -> None:
    """The test stores' forgery (tests/spark/stores.py) really leaves CRC-32 unchanged."""
    original = bytes(range(256)) * 3
    for at in (7, 100, len(original) - 4):
        forged = crc32_patch(original, b"forged!" + original[7:], at)
        assert zlib.crc32(forged) == zlib.crc32(original) and forged[:7] == b"forged!"
