"""Round trips and corruption for every byte layout the store writes: the entry header, the
blank record, the index record, the state file (docs/formats.md)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger import limits
from dledger.log import entry, state_file
from dledger.log.errors import CorruptStateFile
from dledger.log.index_file import RECORD, index_file_first
from dledger.log.layout import file_name, parse_file_name
from dledger.log.segment import entry_position

SEG = 4096

entries = st.tuples(
    st.integers(1, 2**62),  # index
    st.integers(1, 2**62),  # term
    st.integers(0, 2**40),  # position
    st.sampled_from([0, 1, 2]),  # kind
    st.binary(max_size=300),
)


def encoded(index: int = 7, term: int = 3, position: int = 0, body: bytes = b"hello") -> bytes:
    return entry.encode_entry(index, term, position, 0, body)


class TestEntry:
    @given(entries)
    def test_round_trip(self, e: tuple[int, int, int, int, bytes]) -> None:
        """What encode_entry writes, check() accepts and decodes to the same fields."""
        index, term, position, kind, body = e
        data = entry.encode_entry(index, term, position, kind, body)
        assert len(data) == limits.ENTRY_HEADER_BYTES + len(body)
        reason, header = entry.check(data, 0, position=position, index=index, room=len(data))
        assert reason is None and header is not None
        assert (header.index, header.term, header.position, header.kind) == e[:4]
        assert header.size == len(data) and header.body_crc == zlib.crc32(body)
        assert data[limits.ENTRY_HEADER_BYTES :] == body

    def test_layout_matches_the_spec(self) -> None:
        """Offsets as docs/formats.md draws them, decoded with the spec's struct format."""
        data = encoded(index=9, term=4, position=4096, body=b"xyz")
        fields = struct.unpack(">IIqqqHHII", data[:44])
        assert fields[:7] == (0x444C4531, 47, 9, 4, 4096, 0, 0)
        assert fields[7] == zlib.crc32(b"xyz")
        assert fields[8] == zlib.crc32(data[:40])

    @given(st.integers(0, 44 + 4 - 1))
    def test_any_flipped_byte_is_caught(self, offset: int) -> None:
        """A flipped bit anywhere in header or body fails a CRC or a field check."""
        data = bytearray(encoded(body=b"body"))
        data[offset] ^= 0x01
        reason, _ = entry.check(bytes(data), 0, position=0, index=7, room=len(data) + 100)
        assert reason is not None

    def test_flipped_body_names_body_crc(self) -> None:
        data = bytearray(encoded())
        data[-1] ^= 0xFF
        reason, header = entry.check(bytes(data), 0, position=0, index=7, room=SEG)
        assert reason == "body crc mismatch"
        assert header is not None  # the header still holds: its size can be trusted

    def test_flipped_header_names_header_crc(self) -> None:
        data = bytearray(encoded())
        data[20] ^= 0x01  # term
        reason, header = entry.check(bytes(data), 0, position=0, index=7, room=SEG)
        assert reason == "header crc mismatch" and header is None

    def test_cut_tail_runs_past_the_data(self) -> None:
        """A body cut short (zeros after it, as in a torn write) fails the body CRC."""
        data = encoded(body=b"x" * 100)
        torn = data[:80] + bytes(SEG - 80)
        reason, _ = entry.check(torn, 0, position=0, index=7, room=SEG)
        assert reason == "body crc mismatch"

    def test_zeros_are_not_an_entry(self) -> None:
        reason, header = entry.check(bytes(SEG), 0, position=0, index=1, room=SEG)
        assert reason is not None and "magic" in reason and header is None

    def test_wrong_index_position_and_room(self) -> None:
        data = encoded(index=7, position=100)
        assert entry.check(data, 0, position=100, index=8, room=SEG)[0] == "index 7, expected 8"
        reason, _ = entry.check(data, 0, position=104, index=7, room=SEG)
        assert reason == "position field 100, found at 104"
        reason, _ = entry.check(data, 0, position=100, index=7, room=len(data) - 1)
        assert reason is not None and "past the segment end" in reason
        reason, _ = entry.check(data, 0, position=100, index=7, room=len(data) + 3)
        assert reason is not None and "leaves 3 bytes" in reason

    def test_bad_kind_and_reserved_with_valid_crc(self) -> None:
        """Fields the CRC covers are still checked: a writer bug is not a valid entry."""
        for kind, reserved, expected in ((9, 0, "unknown kind 9"), (0, 5, "reserved field")):
            head = entry.HEADER_COVERED.pack(entry.ENTRY_MAGIC, 44, 1, 1, 0, kind, reserved, 0)
            data = head + struct.pack(">I", zlib.crc32(head))
            reason, _ = entry.check(data, 0, position=0, index=1, room=SEG)
            assert reason is not None and expected in reason

    def test_encode_run_equals_entries_back_to_back(self) -> None:
        bodies = [b"", b"a", b"bb" * 50]
        sizes = [44 + len(b) for b in bodies]
        positions = [10, 10 + sizes[0], 10 + sizes[0] + sizes[1]]
        run = entry.encode_run(5, [1, 1, 2], [0, 1, 2], bodies, positions, sizes)
        single = b"".join(
            entry.encode_entry(5 + k, [1, 1, 2][k], positions[k], k, bodies[k]) for k in range(3)
        )
        assert run == single


class TestBlank:
    def test_round_trip(self) -> None:
        tail = entry.encode_blank(100) + bytes(92)
        assert entry.blank_defect(tail, 0, 100) is None

    def test_wrong_size(self) -> None:
        tail = entry.encode_blank(100) + bytes(92)
        reason = entry.blank_defect(tail + bytes(8), 0, 108)
        assert reason == "blank record of 100 bytes, but 108 bytes are left in the segment"

    def test_garbage_after_blank(self) -> None:
        tail = bytearray(entry.encode_blank(100) + bytes(92))
        tail[50] = 1
        assert entry.blank_defect(bytes(tail), 0, 100) == (
            "blank record is not zero after its size field"
        )

    def test_too_small(self) -> None:
        assert entry.blank_defect(b"BLNK", 0, 4) is not None


class TestPlacement:
    @pytest.mark.parametrize(
        ("write", "size", "expected"),
        [
            (0, 100, 0),
            (4000, 96, 4000),  # ends exactly at the segment end
            (4000, 97, 4096),  # would run past it
            (4000, 90, 4096),  # would leave 6 bytes: a blank record needs 8
            (4000, 88, 4000),  # leaves exactly 8
            (4096, 4096, 4096),
        ],
    )
    def test_blank_record_rule(self, write: int, size: int, expected: int) -> None:
        assert entry_position(write, size, SEG) == expected


class TestIndexRecord:
    @given(st.integers(0, 2**62), st.integers(1, 2**62), st.integers(1, 2**62))
    def test_round_trip(self, position: int, index: int, term: int) -> None:
        record = RECORD.pack(position, index, term, 1000, 2, 0)
        assert len(record) == 32
        assert RECORD.unpack(record) == (position, index, term, 1000, 2, 0)

    def test_file_naming(self) -> None:
        assert index_file_first(1, 8) == 1
        assert index_file_first(8, 8) == 1
        assert index_file_first(9, 8) == 9
        assert file_name(9) == "00000000000000000009"
        assert parse_file_name("00000000000000000009") == 9
        assert parse_file_name("00000000000000000009.tmp") is None
        assert parse_file_name("0000000000000000000x") is None


class TestStateFile:
    def test_round_trip(self, tmp_path: Path) -> None:
        path = tmp_path / "checkpoint"
        body = {"commit_index": 5, "vote": None, "name": "n0"}
        state_file.write_state_file(path, state_file.CHECKPOINT_MAGIC, body)
        assert state_file.read_state_file(path, state_file.CHECKPOINT_MAGIC) == body
        assert not (tmp_path / "checkpoint.tmp").exists()

    def test_absent_is_none(self, tmp_path: Path) -> None:
        assert state_file.read_state_file(tmp_path / "meta", state_file.META_MAGIC) is None

    def test_layout_matches_the_spec(self, tmp_path: Path) -> None:
        path = tmp_path / "meta"
        state_file.write_state_file(path, state_file.META_MAGIC, {"a": 1})
        data = path.read_bytes()
        magic, version, length = struct.unpack(">4sII", data[:12])
        assert (magic, version, length) == (b"DLMT", 1, len(data) - 16)
        assert struct.unpack(">I", data[-4:])[0] == zlib.crc32(data[:-4])

    @pytest.mark.parametrize(
        ("damage", "reason"),
        [
            (lambda d: d[:-1], "file is"),  # cut the tail
            (lambda d: d + bytes(4), "file is"),  # pad with zeros
            (lambda d: d[:5], "shorter than an empty state file"),
            (lambda d: d[:14] + bytes([d[14] ^ 1]) + d[15:], "crc mismatch"),  # flip in body
            (lambda d: b"XXXX" + d[4:], "magic"),
            (lambda d: d[:4] + struct.pack(">I", 2) + d[8:], "version 2"),
        ],
    )
    def test_corruption_is_named(self, tmp_path: Path, damage, reason: str) -> None:  # type: ignore[no-untyped-def]
        path = tmp_path / "checkpoint"
        state_file.write_state_file(path, state_file.CHECKPOINT_MAGIC, {"commit_index": 5})
        path.write_bytes(damage(path.read_bytes()))
        with pytest.raises(CorruptStateFile) as info:
            state_file.read_state_file(path, state_file.CHECKPOINT_MAGIC)
        assert reason in info.value.reason
        assert str(path) in str(info.value)

    def test_body_not_a_map(self, tmp_path: Path) -> None:
        path = tmp_path / "hardstate"
        data = state_file.encode_state(b"DLHS", {"x": 1})
        packed = b"\x93\x01\x02\x03"  # a msgpack list
        head = struct.pack(">4sII", b"DLHS", 1, len(packed)) + packed
        path.write_bytes(head + struct.pack(">I", zlib.crc32(head)))
        assert data  # the encoder itself only writes maps
        with pytest.raises(CorruptStateFile, match="body is a list"):
            state_file.read_state_file(path, state_file.HARDSTATE_MAGIC)

    def test_leftover_tmp_is_ignored(self, tmp_path: Path) -> None:
        """A crash between writing the temp file and the rename leaves the old state."""
        path = tmp_path / "checkpoint"
        state_file.write_state_file(path, state_file.CHECKPOINT_MAGIC, {"commit_index": 1})
        (tmp_path / "checkpoint.tmp").write_bytes(b"garbage")
        assert state_file.read_state_file(path, state_file.CHECKPOINT_MAGIC) == {"commit_index": 1}
