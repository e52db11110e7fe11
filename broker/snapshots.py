"""The leader re-proposes the whole metadata as one log entry well within each retention
period, so a replica that rebuilds from a log whose older segments were deleted still learns
every topic, group and committed offset (broker/state.py applies it only then)."""

from __future__ import annotations

import logging
import time

import trio

from broker.context import Broker
from broker.entries import encode_meta
from broker.writes import WriteFailed, WriteUnknown

log = logging.getLogger("broker.snapshots")

SNAPSHOT_CHECK_S = 10.0  # how often the leader asks whether a snapshot is due
SNAPSHOT_INTERVAL_MS_MAX = 3_600_000  # at least hourly, and 4 times per retention period
SNAPSHOT_WRITE_TIMEOUT_S = 10.0


def snapshot_interval_ms(file_reserved_hours: float) -> int:
    return int(min(SNAPSHOT_INTERVAL_MS_MAX, file_reserved_hours * 3_600_000 / 4))


def snapshot_due(broker: Broker, now_ms: int) -> bool:
    state = broker.state
    interval = snapshot_interval_ms(broker.config.file_reserved_hours)
    return broker.node.accepting_appends and now_ms - state.last_snapshot_at_ms >= interval


async def propose_snapshots(broker: Broker) -> None:
    while True:
        await trio.sleep(SNAPSHOT_CHECK_S)
        now_ms = int(time.time() * 1000)
        if not snapshot_due(broker, now_ms):
            continue
        state = broker.state
        op = state.metadata.snapshot_op(state.applied_index, now_ms)
        try:
            await broker.writes.append([encode_meta(op)], SNAPSHOT_WRITE_TIMEOUT_S)
            log.info("metadata snapshot as of index %d proposed", op["as_of"])
        except (WriteFailed, WriteUnknown) as err:
            log.warning("metadata snapshot not written (%s); the next check tries again", err)
