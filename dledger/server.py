"""dledger-server: one replica of a replicated log group, standalone (as DLedger runs).

    dledger-server --group g --self-id n0 \\
        --peers "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913" --store ./data/g/n0

Exit status: 0 after SIGTERM/SIGINT, 1 when the store cannot be opened or the port bound,
2 for a bad command line.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from functools import partial
from pathlib import Path

import trio

from dledger import limits
from dledger.config import ConfigError, NodeConfig, parse_peers, raft_config_from_ms
from dledger.exceptions import operator_error
from dledger.hosting import host_node, settle_heap
from dledger.log.store import FlushPolicy, LogStore, StoreConfig
from dledger.node import Node

log = logging.getLogger("dledger.server")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dledger-server", description="One replica of a dledger group."
    )
    p.add_argument("--group", required=True, help="group name, the same on every replica")
    p.add_argument("--self-id", required=True, help="this replica's id, one of --peers")
    p.add_argument("--peers", required=True, help='"n0-host:port;n1-host:port;..." (DLedger form)')
    p.add_argument("--store", required=True, type=Path, help="store directory of this replica")
    p.add_argument(
        "--flush",
        choices=[f.value for f in FlushPolicy],
        default="SYNC_FLUSH",
        help="SYNC_FLUSH: ack after fsync on a quorum; ASYNC_FLUSH: after a quorum wrote it",
    )
    p.add_argument("--tick-ms", type=int, default=limits.TICK_MS_DEFAULT)
    p.add_argument(
        "--heartbeat-ms", type=int, default=limits.HEARTBEAT_TICKS_DEFAULT * limits.TICK_MS_DEFAULT
    )
    p.add_argument(
        "--election-timeout-ms",
        type=int,
        default=limits.ELECTION_TICKS_MIN_DEFAULT * limits.TICK_MS_DEFAULT,
        help="shortest election timeout; each one is random in [this, --election-timeout-max-ms)",
    )
    p.add_argument(
        "--election-timeout-max-ms",
        type=int,
        default=limits.ELECTION_TICKS_MAX_DEFAULT * limits.TICK_MS_DEFAULT,
    )
    p.add_argument("--preferred-leader", help="hand leadership to this peer whenever it is healthy")
    p.add_argument(
        "--segment-bytes",
        type=int,
        default=limits.SEGMENT_BYTES_DEFAULT,
        help="data segment size; the same on every replica of the group",
    )
    p.add_argument(
        "--index-records-per-file", type=int, default=limits.INDEX_RECORDS_PER_FILE_DEFAULT
    )
    p.add_argument(
        "--flush-interval-ms",
        type=int,
        default=limits.FLUSH_INTERVAL_MS_DEFAULT,
        help="ASYNC_FLUSH: fsync whatever is dirty at least this often (flushIntervalCommitLog)",
    )
    p.add_argument(
        "--flush-least-pages",
        type=int,
        default=limits.FLUSH_LEAST_PAGES_DEFAULT,
        help="ASYNC_FLUSH: fsync sooner once this many pages are dirty (flushCommitLogLeastPages)",
    )
    p.add_argument(
        "--flush-timed",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="ASYNC_FLUSH: RocketMQ's timed flush (flushCommitLogTimed): at most one fsync per "
        "interval, and only once --flush-least-pages are dirty (or after 10 s)",
    )
    p.add_argument(
        "--cache-tail-bytes",
        type=int,
        default=limits.CACHE_TAIL_BYTES_DEFAULT,
        help="keep this much of the log's newest bytes in the page cache and let go of older "
        "pages after each flush (0: leave it to the kernel)",
    )
    p.add_argument("--file-reserved-hours", type=float, default=72.0, help="fileReservedTime")
    p.add_argument(
        "--delete-when", type=int, default=4, help="deleteWhen: the hour retention runs (0-23)"
    )
    p.add_argument(
        "--disk-max-used-ratio", type=float, default=0.75, help="diskMaxUsedSpaceRatio, 0-1"
    )
    p.add_argument(
        "--checkpoint-interval-ms", type=int, default=limits.CHECKPOINT_INTERVAL_MS_DEFAULT
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="at start, cut the log at a corrupt entry even when valid entries follow it",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    raft = raft_config_from_ms(
        args.tick_ms,
        args.heartbeat_ms,
        args.election_timeout_ms,
        args.election_timeout_max_ms,
        args.preferred_leader,
    )
    try:
        store = StoreConfig(
            segment_bytes=args.segment_bytes,
            index_records_per_file=args.index_records_per_file,
            flush=FlushPolicy(args.flush),
            flush_interval_ms=args.flush_interval_ms,
            flush_least_pages=args.flush_least_pages,
            flush_timed=args.flush_timed,
            cache_tail_bytes=args.cache_tail_bytes,
            repair=args.repair,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return NodeConfig(
        group=args.group,
        self_id=args.self_id,
        peers=parse_peers(args.peers),
        store_dir=args.store,
        tick_ms=args.tick_ms,
        raft=raft,
        store=store,
        checkpoint_interval_ms=args.checkpoint_interval_ms,
        file_reserved_hours=args.file_reserved_hours,
        delete_when_hour=args.delete_when,
        disk_max_used_ratio=args.disk_max_used_ratio,
    )


async def serve(
    config: NodeConfig, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED
) -> None:
    """Open the store, run the node until cancelled or signalled; files closed on every way out."""
    with LogStore.open(
        config.store_dir, config.store, group=config.group, self_id=config.self_id
    ) as store:
        report = store.recovery
        log.info("store recovered: %s", report)
        node = Node(config, store)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
            listeners = await nursery.start(partial(host_node, node))
            addresses = ", ".join(str(listener.socket.getsockname()[:2]) for listener in listeners)
            log.info("%s of group %s serving on %s", config.self_id, config.group, addresses)
            settle_heap()
            task_status.started(node)


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping on %s", signal.Signals(signum).name)
            scope.cancel()
            return


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as err:
        parser.error(str(err))  # exits 2
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s {config.self_id} %(levelname)s %(name)s: %(message)s",
    )
    try:
        trio.run(serve, config)
    except Exception as exc:  # one line to stderr for what an operator can fix, else re-raise
        line = operator_error(exc, "dledger-server", config.store_dir)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
