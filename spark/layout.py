"""Find the replicas under the paths an operator names, and what each replica's files are.

A replica is found by its `dledger/meta` file (docs/formats.md#store-directory); its group and
name come from `meta`, never from the path, so stores can be copied anywhere for an audit. A
path may also be a small JSON manifest, `{"stores": ["g/n0", "/abs/g/n1", ...]}`, for store
sets that are not under one directory. Discovery runs on the driver and only lists files and
reads the small state files; the data is read by executors (spark/read.py).

Paths are local paths, `file://` URIs, or any URI pyarrow.fs opens (the executors must be able
to open the same URI).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Sequence

import attrs
import pyarrow.fs as pafs

from spark import formats

STORE_DIR = "dledger"  # inside a replica's store: dledger/meta, dledger/data, dledger/index
SEARCH_DEPTH_MAX = 8  # levels below a --stores path searched for dledger/meta
MANIFEST_BYTES_MAX = 1 << 20  # a manifest lists paths; a bigger file is not a manifest
STATE_FILE_BYTES_MAX = formats.STATE_BODY_BYTES_MAX + 16


@attrs.define
class InputUnreadable(Exception):
    """An input the audit cannot read at all: the CLI exits 2 with this path and reason."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@attrs.frozen
class DataFile:
    """A segment (first = its first position) or an index file (first = its first index)."""

    first: int
    name: str  # relative to the store, e.g. "data/00000000000000000000"
    bytes: int


@attrs.frozen
class Replica:
    """One replica's store as found on disk: identity from meta, commit from checkpoint."""

    group: str
    name: str  # the replica's self_id
    uri: str  # the store directory (the one holding dledger/), as a pyarrow.fs URI or path
    segment_bytes: int
    index_records_per_file: int
    start_index: int  # first retained index
    start_prev_term: int
    start_position: int
    commit_index: int  # from the checkpoint; 0 when the store has none yet
    applied_index: int
    has_checkpoint: bool
    segments: tuple[DataFile, ...]
    index_files: tuple[DataFile, ...]

    @property
    def key(self) -> tuple[str, str]:
        """(group, name): unique among the replicas of one audit."""
        return (self.group, self.name)

    def path(self, name: str) -> str:
        """A file of this store, e.g. path("data/000...0") -> <store>/dledger/data/000...0."""
        return posixpath.join(self.uri, STORE_DIR, name)

    def segment_of(self, position: int) -> int:
        """First position of the segment that holds `position`."""
        return position - position % self.segment_bytes


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path inside it for a local path or a URI."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), posixpath.abspath(uri)
    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for unknown schemes
        raise InputUnreadable(uri, f"cannot open filesystem: {err}") from err


def discover(paths: Sequence[str]) -> list[Replica]:
    """Every replica under `paths`, sorted by (group, name); raises InputUnreadable."""
    replicas: dict[tuple[str, str], Replica] = {}
    for path in paths:
        for store in _stores_under(path):
            replica = read_replica(store)
            key = (replica.group, replica.name)
            if key in replicas:
                raise InputUnreadable(
                    store,
                    f"replica {replica.name} of {replica.group} also found at {replicas[key].uri}",
                )
            replicas[key] = replica
    return [replicas[key] for key in sorted(replicas)]


def _stores_under(path: str) -> list[str]:
    fs, local = filesystem(path)
    try:
        info = fs.get_file_info(local)
    except OSError as err:
        raise InputUnreadable(path, str(err)) from err
    if info.type == pafs.FileType.NotFound:
        raise InputUnreadable(path, "no such file or directory")
    if info.type == pafs.FileType.File:
        return _read_manifest(fs, path, local)
    stores = sorted(_search(fs, local, depth=0))
    if not stores:
        raise InputUnreadable(path, f"no {STORE_DIR}/meta found within {SEARCH_DEPTH_MAX} levels")
    prefix = path[: len(path) - len(local)] if "://" in path and path.endswith(local) else ""
    return [prefix + store for store in stores]


def _search(fs: pafs.FileSystem, directory: str, depth: int) -> Iterable[str]:
    meta = posixpath.join(directory, STORE_DIR, "meta")
    if fs.get_file_info(meta).type == pafs.FileType.File:
        yield directory
        return  # a store's own data and index folders hold no further stores
    if depth >= SEARCH_DEPTH_MAX:
        return
    try:
        children = fs.get_file_info(pafs.FileSelector(directory))
    except OSError as err:
        raise InputUnreadable(directory, str(err)) from err
    for child in children:
        if child.type == pafs.FileType.Directory:
            yield from _search(fs, child.path, depth + 1)


def _read_manifest(fs: pafs.FileSystem, path: str, local: str) -> list[str]:
    raw = read_small(fs, path, local, MANIFEST_BYTES_MAX)
    try:
        stores = json.loads(raw)["stores"]
        assert isinstance(stores, list) and all(isinstance(s, str) for s in stores)
    except (ValueError, KeyError, TypeError, AssertionError) as err:
        raise InputUnreadable(path, 'not a manifest: expected {"stores": [path, ...]}') from err
    base = posixpath.dirname(path)
    found: list[str] = []
    for store in stores:
        found.extend(
            _stores_under(
                store if posixpath.isabs(store) or "://" in store else posixpath.join(base, store)
            )
        )
    return found


def read_small(fs: pafs.FileSystem, path: str, local: str, bytes_max: int) -> bytes:
    try:
        with fs.open_input_file(local) as f:
            size = f.size()
            if size > bytes_max:
                raise InputUnreadable(path, f"{size} bytes, more than the {bytes_max} expected")
            return bytes(f.read())
    except OSError as err:
        raise InputUnreadable(path, str(err)) from err


def read_replica(store: str) -> Replica:
    """Identity, start and commit of the store at `store`, and its data and index files."""
    fs, local = filesystem(store)

    def state(name: str, magic: bytes) -> dict[str, object]:
        path = posixpath.join(store, STORE_DIR, name)
        raw = read_small(fs, path, posixpath.join(local, STORE_DIR, name), STATE_FILE_BYTES_MAX)
        try:
            return formats.decode_state(raw, magic)
        except formats.BadStateFile as err:
            raise InputUnreadable(path, str(err)) from err

    meta = state("meta", formats.META_MAGIC)
    meta_path = posixpath.join(store, STORE_DIR, "meta")
    checkpoint_path = posixpath.join(store, STORE_DIR, "checkpoint")
    has_checkpoint = (
        fs.get_file_info(posixpath.join(local, STORE_DIR, "checkpoint")).type == pafs.FileType.File
    )
    checkpoint = state("checkpoint", formats.CHECKPOINT_MAGIC) if has_checkpoint else {}
    return Replica(
        group=_str(meta, "group", meta_path),
        name=_str(meta, "self_id", meta_path),
        uri=store,
        segment_bytes=_int(meta, "segment_bytes", meta_path, low=1),
        index_records_per_file=_int(meta, "index_records_per_file", meta_path, low=1),
        start_index=_int(meta, "start_index", meta_path, low=1),
        start_prev_term=_int(meta, "start_prev_term", meta_path),
        start_position=_int(meta, "start_position", meta_path),
        commit_index=_int(checkpoint, "commit_index", checkpoint_path, default=0),
        applied_index=_int(checkpoint, "applied_index", checkpoint_path, default=0),
        has_checkpoint=has_checkpoint,
        segments=_list_files(fs, store, local, "data"),
        index_files=_list_files(fs, store, local, "index"),
    )


def _str(body: dict[str, object], key: str, path: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise InputUnreadable(path, f"key {key!r} is {value!r}, expected a non-empty string")
    return value


def _int(
    body: dict[str, object], key: str, path: str, low: int = 0, default: int | None = None
) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InputUnreadable(path, f"key {key!r} is {value!r}, expected an integer >= {low}")
    return value


def _list_files(fs: pafs.FileSystem, store: str, local: str, folder: str) -> tuple[DataFile, ...]:
    directory = posixpath.join(local, STORE_DIR, folder)
    try:
        infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except OSError as err:
        raise InputUnreadable(posixpath.join(store, STORE_DIR, folder), str(err)) from err
    files = []
    for info in infos:
        base = posixpath.basename(info.path)
        if (
            info.type == pafs.FileType.File
            and len(base) == formats.FILE_NAME_DIGITS
            and base.isdigit()
        ):
            files.append(DataFile(int(base), f"{folder}/{base}", int(info.size)))
    return tuple(sorted(files, key=lambda f: f.first))
