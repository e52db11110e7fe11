"""Where a push consumer keeps its consume offsets (the next offset to consume, per queue).

Both stores hold the offsets in memory (`update`, `read_local`) and write them out in the
background every 5 s and on close (`persist`):

- `RemoteOffsetStore` (clustering): on the brokers, shared by the group. `persist` sends
  UPDATE_CONSUMER_OFFSET for each queue whose offset changed, to the group's master and, when
  that fails, to another replica (ours forward it to the leader); `read_stored` asks
  QUERY_CONSUMER_OFFSET (None when the broker has none).
- `LocalOffsetStore` (broadcasting): every consumer has its own offsets, in a JSON file
  `<directory>/<client key>/<group>/offsets.json` (RocketMQ's layout, default directory
  ~/.rocketmq_offsets), replaced atomically (written to a temporary file, fsynced, renamed
  over the old one, the directory fsynced), so a crash leaves the old file or the new one:

      {"group": "g", "offsetTable": [{"topic": "T", "brokerName": "broker-a", "queueId": 0,
                                      "offset": 12}, ...]}
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import trio

from client.consumer_requests import ConsumerRequests
from client.errors import BrokerUnreachable, MQBrokerError, NoRouteError
from client.message import MessageQueue

log = logging.getLogger("client.offset_store")

PERSIST_S = 5.0  # persistConsumerOffsetInterval
OFFSET_DIR_DEFAULT = "~/.rocketmq_offsets"  # RocketMQ's rocketmq.client.localOffsetStoreDir
OFFSET_FILE = "offsets.json"


class OffsetStore(Protocol):
    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None: ...

    def read_local(self, queue: MessageQueue) -> int | None: ...

    async def read_stored(self, queue: MessageQueue) -> int | None: ...

    async def persist(self, queues: Iterable[MessageQueue]) -> None: ...

    def forget(self, queue: MessageQueue) -> None: ...


class _Table:
    """The in-memory part both stores share."""

    def __init__(self) -> None:
        self._offsets: dict[MessageQueue, int] = {}
        self._persisted: dict[MessageQueue, int] = {}

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Set the offset to commit; with `increase_only` it never moves back (a late answer
        of an older batch cannot undo a newer one)."""
        old = self._offsets.get(queue)
        if old is None or not increase_only or offset > old:
            self._offsets[queue] = offset

    def read_local(self, queue: MessageQueue) -> int | None:
        return self._offsets.get(queue)

    def forget(self, queue: MessageQueue) -> None:
        self._offsets.pop(queue, None)
        self._persisted.pop(queue, None)

    def changed(self, queues: Iterable[MessageQueue]) -> list[tuple[MessageQueue, int]]:
        out = []
        for queue in queues:
            offset = self._offsets.get(queue)
            if offset is not None and self._persisted.get(queue) != offset:
                out.append((queue, offset))
        return out


class RemoteOffsetStore(_Table):
    def __init__(self, requests: ConsumerRequests, group: str) -> None:
        super().__init__()
        self._requests = requests
        self._group = group

    async def read_stored(self, queue: MessageQueue) -> int | None:
        return await self._requests.query_offset(self._group, queue)

    async def persist(self, queues: Iterable[MessageQueue]) -> None:
        """Commit every changed offset of `queues`; a failure is logged and the offset stays
        changed, so the next round sends it again."""

        async def one(queue: MessageQueue, offset: int) -> None:
            try:
                await self._requests.update_offset(self._group, queue, offset)
            except (MQBrokerError, BrokerUnreachable, NoRouteError) as err:
                log.warning(
                    "offset %d of %s not committed (next round retries): %s", offset, queue, err
                )
                return
            self._persisted[queue] = offset

        async with trio.open_nursery() as nursery:
            for queue, offset in self.changed(queues):
                nursery.start_soon(one, queue, offset)


def offset_file_path(directory: str | os.PathLike[str], client_key: str, group: str) -> Path:
    """<directory>/<client key>/<group>/offsets.json, `~` expanded."""
    for name, value in (("client key", client_key), ("group", group)):
        if not value or "/" in value or value in (".", ".."):
            raise ValueError(f"the {name} {value!r} cannot name a directory")
    return Path(directory).expanduser() / client_key / group / OFFSET_FILE


def read_offset_file(path: Path) -> dict[MessageQueue, int]:
    """The offsets in a file `write_offset_file` wrote; {} when there is none. A file that is
    not one raises ValueError naming it (never silently restart from consume_from)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
        return {
            MessageQueue(str(e["topic"]), str(e["brokerName"]), int(e["queueId"])): int(e["offset"])
            for e in data["offsetTable"]
        }
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not an offsets file: {err}") from None


def write_offset_file(path: Path, group: str, offsets: dict[MessageQueue, int]) -> None:
    """Replace the file atomically: temporary file, fsync, rename, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = [{**q.as_json(), "offset": offsets[q]} for q in sorted(offsets)]
    data = json.dumps({"group": group, "offsetTable": table}, indent=1).encode()
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class LocalOffsetStore(_Table):
    def __init__(self, path: Path, group: str) -> None:
        super().__init__()
        self.path = path
        self._group = group
        self._stored = read_offset_file(path)
        self._lock = trio.Lock()

    async def read_stored(self, queue: MessageQueue) -> int | None:
        return self._stored.get(queue)

    async def persist(self, queues: Iterable[MessageQueue]) -> None:
        """Write the file when an offset of `queues` changed; queues the file holds that this
        consumer no longer owns keep their offsets."""
        async with self._lock:
            changed = self.changed(queues)
            if not changed:
                return
            merged = {**self._stored, **dict(changed)}
            try:
                await trio.to_thread.run_sync(write_offset_file, self.path, self._group, merged)
            except OSError as err:
                log.warning("offsets not written to %s (next round retries): %s", self.path, err)
                return
            self._stored = merged
            self._persisted.update(changed)
