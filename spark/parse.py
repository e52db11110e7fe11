"""Executor-side byte parsing: index records and entry headers of one replica, vectorised.

Used by spark/read.py inside mapInArrow tasks, and plain enough to test without a JVM. Every
read is bounded: index records by the caller's slot range, data by WINDOW_BYTES_MAX plus one
entry. Bytes past the end of a file that is shorter than its segment read as zeros, which is
what an unwritten part of a preallocated segment holds (magic 0 = end of data).
"""

from __future__ import annotations

import hashlib
import posixpath
from types import TracebackType

import attrs
import numpy as np
import pyarrow.fs as pafs
from isal import isal_zlib
from numpy.lib.stride_tricks import sliding_window_view

from spark import crc, formats, layout

DIGEST_BYTES = 32  # SHA-256 of each body: what replicas must agree on (docs/decisions.md)
WINDOW_BYTES_MAX = 16 * formats.MiB  # data bytes read at once, plus at most one entry
OPEN_SEGMENTS_MAX = 4  # a task's entries fall in one or two segments; more are closed again
assert WINDOW_BYTES_MAX >= formats.ENTRY_BYTES_MAX  # a window always holds a whole entry


@attrs.define
class Entries:
    """What the data holds at n positions; int64 arrays unless said otherwise."""

    file_names: list[str]  # the data segments of these positions; file_of[i] indexes it
    file_of: np.ndarray  # intp
    defect: list[str | None]
    io_error: list[str | None]
    no_header: np.ndarray  # bool: nothing could be read there (defect or io_error)
    file_bytes: np.ndarray  # the length of the data file holding each position (0: missing)
    magic: np.ndarray
    size: np.ndarray
    index: np.ndarray
    term: np.ndarray
    position: np.ndarray
    kind: np.ndarray  # int32
    body_crc: np.ndarray
    header_ok: np.ndarray  # bool
    body_ok: np.ndarray  # bool; meaningful where header_ok
    digest: np.ndarray  # uint8, n x DIGEST_BYTES: SHA-256 of the body; zeros where no header
    after_magic: np.ndarray  # -1: no bytes follow (the entry ends its segment, or no header)
    after_size: np.ndarray

    @classmethod
    def empty(cls, n: int) -> Entries:
        zeros = np.zeros(n, dtype=np.int64)
        return cls(
            file_names=[""],
            file_of=np.zeros(n, dtype=np.intp),
            defect=[None] * n,
            io_error=[None] * n,
            no_header=np.ones(n, dtype=bool),
            file_bytes=zeros.copy(),
            magic=zeros.copy(),
            size=zeros.copy(),
            index=zeros.copy(),
            term=zeros.copy(),
            position=zeros.copy(),
            kind=np.zeros(n, dtype=np.int32),
            body_crc=zeros.copy(),
            header_ok=np.zeros(n, dtype=bool),
            body_ok=np.zeros(n, dtype=bool),
            digest=np.zeros((n, DIGEST_BYTES), dtype=np.uint8),
            after_magic=np.full(n, -1, dtype=np.int64),
            after_size=np.full(n, -1, dtype=np.int64),
        )


class Files:
    """The open files of one replica within one task; closed when the task ends."""

    def __init__(self, replica: layout.Replica) -> None:
        self.replica = replica
        self.fs, self.root = layout.filesystem(replica.uri)
        self._open: dict[str, pafs.NativeFile] = {}
        self._sizes = {f.name: f.bytes for f in (*replica.segments, *replica.index_files)}

    def __enter__(self) -> Files:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()

    def exists(self, name: str) -> bool:
        return name in self._sizes

    def size(self, name: str) -> int:
        """The file's length as listed when the audit began; 0 when it does not exist."""
        return self._sizes.get(name, 0)

    def read(self, name: str, at: int, length: int) -> np.ndarray:
        """`length` bytes of file `name` from `at`, zeros past its end. Raises OSError."""
        f = self._open.get(name)
        if f is None:
            if len(self._open) >= OPEN_SEGMENTS_MAX:
                self._open.pop(next(iter(self._open))).close()
            f = self.fs.open_input_file(posixpath.join(self.root, layout.STORE_DIR, name))
            self._open[name] = f
        have = max(0, min(length, self._sizes[name] - at))
        data = np.frombuffer(f.read_at(have, at), dtype=np.uint8) if have else np.zeros(0, np.uint8)
        if len(data) < length:
            data = np.concatenate([data, np.zeros(length - len(data), dtype=np.uint8)])
        return data

    def index_records(self, lo: int, hi: int) -> np.ndarray:
        """Records of slots [lo, hi) (zero = not written where a file is missing or short)."""
        n_per_file = self.replica.index_records_per_file
        records = np.zeros(hi - lo, dtype=formats.INDEX_RECORD)
        slot = lo
        while slot < hi:
            first = formats.index_file_first(slot, n_per_file)
            end = min(hi, first + n_per_file)
            name = "index/" + formats.file_name(first)
            if self.exists(name):
                raw = self.read(name, (slot - first) * 32, (end - slot) * 32)
                records[slot - lo : end - lo] = raw.view(formats.INDEX_RECORD)
            slot = end
        return records


def read_entries(
    replica: layout.Replica, files: Files, positions: np.ndarray, rec_sizes: np.ndarray
) -> Entries:
    """Parse the entry headers at `positions`, check header and body CRCs, and read the 8 bytes
    after each entry. The index records' sizes only bound the windows read: a wrong one costs
    an extra read, never a wrong answer."""
    n = len(positions)
    out = Entries.empty(n)
    pos = positions.astype(np.int64)
    seg_bytes = replica.segment_bytes
    seg = pos - pos % seg_bytes
    # per segment, not per entry: names and existence of the (few) segments of this chunk
    segments, seg_of = np.unique(seg, return_inverse=True)
    seg_of = seg_of.reshape(-1)
    names = ["data/" + formats.file_name(int(s)) for s in segments]
    out.file_names, out.file_of = names, seg_of
    present = np.array([files.exists(name) for name in names], dtype=bool)[seg_of]
    out.file_bytes = np.array([files.size(name) for name in names], dtype=np.int64)[seg_of]
    readable = pos >= 0
    for i in np.flatnonzero(~readable):
        out.defect[i] = f"negative position {pos[i]}"
    for i in np.flatnonzero(readable & (pos % seg_bytes + formats.ENTRY_HEADER_BYTES > seg_bytes)):
        readable[i] = False
        out.defect[i] = "header would run past the segment end"
    for i in np.flatnonzero(readable & ~present):
        readable[i] = False
        out.defect[i] = f"segment file {names[seg_of[i]]} missing"
    span = np.clip(rec_sizes.astype(np.int64), formats.ENTRY_HEADER_BYTES, formats.ENTRY_BYTES_MAX)
    candidates = np.flatnonzero(readable)
    if len(candidates) == 0:
        return out
    windows_per_segment = seg_bytes // WINDOW_BYTES_MAX + 1
    key = (
        seg_of[candidates] * windows_per_segment + (pos[candidates] % seg_bytes) // WINDOW_BYTES_MAX
    )
    _, group_of = np.unique(key, return_inverse=True)
    group_of = group_of.reshape(-1)
    for g in range(int(group_of.max()) + 1):
        members = candidates[group_of == g]
        first = int(seg[members[0]])
        lo = int(pos[members].min())
        seg_end = first + seg_bytes
        hi = min(seg_end, int((pos[members] + span[members]).max()) + formats.BLANK_BYTES_MIN)
        name = names[seg_of[members[0]]]
        try:
            window = files.read(name, lo - first, hi - lo)
            _parse_window(files, out, members, pos[members], window, lo, first, seg_bytes, name)
        except OSError as err:
            for i in members:
                out.io_error[i] = f"{replica.path(name)}: {err}"
                out.no_header[i] = True
                out.header_ok[i] = False
    return out


def _parse_window(
    files: Files,
    out: Entries,
    members: np.ndarray,
    pos: np.ndarray,
    window: np.ndarray,
    lo: int,
    first: int,
    seg_bytes: int,
    name: str,
) -> None:
    """Headers, CRCs and following bytes of the entries at `pos`, all inside `window`."""
    offsets = pos - lo
    # each header's bytes as a row of a sliding view: a copy of rows, not of single bytes
    rows = sliding_window_view(window, formats.ENTRY_HEADER_BYTES)[offsets]
    header = np.ascontiguousarray(rows).view(formats.ENTRY_HEADER).reshape(-1)
    size = header["size"].astype(np.int64)
    shape_ok = (
        (header["magic"] == formats.ENTRY_MAGIC)
        & (size >= formats.ENTRY_HEADER_BYTES)
        & (size <= formats.ENTRY_BYTES_MAX)
        & (pos - first + size <= seg_bytes)
    )
    out.no_header[members] = False
    out.magic[members] = header["magic"]
    out.size[members] = size
    out.index[members] = header["index"]
    out.term[members] = header["term"]
    out.position[members] = header["position"]
    out.kind[members] = header["kind"]
    out.body_crc[members] = header["body_crc"]
    # the usual case, a healthy run of entries back to back: every header and body CRC at
    # once (two ISA-L passes, crc.run_intact); otherwise, or when one fails, entry by entry
    if shape_ok.all() and crc.run_intact(
        window, offsets, size, header["header_crc"], header["body_crc"]
    ):
        good = np.arange(len(members))
        out.header_ok[members] = True
        out.body_ok[members] = True
        ends = offsets + size
        out.digest[members] = _digests(window, offsets + formats.ENTRY_HEADER_BYTES, ends)
    else:
        header_crcs = crc.crc32_rows(rows[:, : formats.ENTRY_HEADER_CRC_BYTES])
        header_ok = shape_ok & (header_crcs == header["header_crc"])
        out.header_ok[members] = header_ok
        good = np.flatnonzero(header_ok)
        if len(good) == 0:
            return
        ends = offsets[good] + size[good]
        starts = offsets[good] + formats.ENTRY_HEADER_BYTES
        got, digests = _body_crcs(files, window, starts, ends, lo - first, name)
        out.body_ok[members[good]] = got == header["body_crc"][good]
        out.digest[members[good]] = digests
    # the 8 bytes after each entry: the next entry's magic and size, a blank record, or zeros
    inside = ends + formats.BLANK_BYTES_MIN <= len(window)
    after = np.zeros((len(good), formats.BLANK_BYTES_MIN), dtype=np.uint8)
    after[inside] = sliding_window_view(window, formats.BLANK_BYTES_MIN)[ends[inside]]
    for j in np.flatnonzero(~inside).tolist():
        at = lo - first + int(ends[j])
        if at < seg_bytes:
            after[j] = files.read(name, at, formats.BLANK_BYTES_MIN)
    words = after.view(">u4").astype(np.int64)
    at_segment_end = lo + ends == first + seg_bytes
    out.after_magic[members[good]] = np.where(at_segment_end, -1, words[:, 0])
    out.after_size[members[good]] = np.where(at_segment_end, -1, words[:, 1])


def _digests(window: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """SHA-256 of each body [starts, ends) of `window`, as an n x DIGEST_BYTES matrix."""
    view = window.data
    sha256 = hashlib.sha256
    joined = b"".join(
        sha256(view[a:b]).digest() for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    )
    return np.frombuffer(joined, dtype=np.uint8).reshape(-1, DIGEST_BYTES)


def _body_crcs(
    files: Files, window: np.ndarray, starts: np.ndarray, ends: np.ndarray, at: int, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """CRC-32 and SHA-256 of each body [starts, ends) of `window` (which starts at `at` in
    file `name`), one ISA-L call per entry; a body past the window's end (its index record
    understated its size) is read on its own."""
    view = window.data
    crcs, digests = [], []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        body = view[a:b] if b <= len(window) else files.read(name, at + a, b - a).data
        crcs.append(isal_zlib.crc32(body))
        digests.append(hashlib.sha256(body).digest())
    matrix = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, DIGEST_BYTES)
    return np.array(crcs, dtype=np.int64), matrix
