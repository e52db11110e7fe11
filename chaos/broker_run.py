"""One broker chaos run (`dledger-chaos run --target broker`), start to end: check the machine,
build a network with a host per process, start the name servers and broker groups, create the
workload's topics, run producers, consumers and the nemesis for the duration, heal, stop
sending, let the consumers drain, read every queue of every replica back, judge, report; and
on every way out stop every process by pid, delete every namespace by name and remove the
scratch directory (chaos/run.py does the same for the dledger target, and its helpers are
shared).

runs/<name>/ gets run.json, history.jsonl, final.json (chaos/broker_final.py), report.json,
report.md, timeline.png, harness.log (what the run's clients logged), logs/ (every process's
log) and, with --keep-stores, stores/<group>/<node> (each replica's store, for dledger-audit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio

from chaos import broker_checks, broker_final, broker_report, capabilities
from chaos.broker_nemesis import ClusterNemesis
from chaos.history import HISTORY_FILE, HistoryWriter, RunClock, iter_history
from chaos.net import Network, NetworkError, entered_namespace
from chaos.run_config import (
    RunConfig,
    SetupFailed,
    cleanup_on_signals,
    signals_blocked,
    watch_signals,
)
from chaos.schedule import BROKER_SCENARIOS, interval_for, plan
from chaos.targets.base import TargetStartFailed
from chaos.targets.broker import BROKER_ARGS, BrokerTarget, cluster_hosts, group_names
from chaos.workloads.messages import MessageWorkload
from client.errors import MQClientError
from dledger.exceptions import find

TOPICS_TIMEOUT_S = 30.0  # the topics created on every group and seen in the routes
QUIET_S = 3.0  # the producers go on this long on the healed cluster after the last fault
DRAIN_TIMEOUT_S = 60.0  # the consumers catch up with every acknowledged message by then
CONSUMER_STOP_S = 20.0  # consumers shut down (commit, unlock, unregister) within this
CONVERGE_TIMEOUT_S = 30.0
RUN_SLACK_S = 240.0  # beyond the duration (start, drain, final read): then it is hung
RUN_SLACK_RATIO = 0.25
PROGRESS_TTY_S = 0.5
PROGRESS_LOG_S = 5.0
HARNESS_LOG = "harness.log"  # what the run's own clients logged (INFO and up)
ISOLATION = (
    "a network namespace per process (name servers and broker replicas), veth pairs to a "
    "bridge in its own namespace; iptables DROP rules in each replica's namespace"
)


class _State:
    def __init__(self) -> None:
        self.interrupted: str | None = None
        self.final: broker_final.BrokerFinal = broker_final.NO_FINAL_READ
        self.notes: list[str] = []  # what went wrong on the way that is not a check

    def finish(self, target: BrokerTarget) -> None:
        problems = self.final.problems
        if self.interrupted is not None and not self.final.complete:
            problems = (f"interrupted by {self.interrupted} before the final read",)
        crashes = tuple(c.describe() for c in target.crashes)
        self.final = attrs.evolve(self.final, problems=(*problems, *self.notes), crashes=crashes)


def run_broker(config: RunConfig, progress: TextIO) -> tuple[Path, dict[str, Any]]:
    """Run it; the run directory's report. SetupFailed when it cannot be set up."""
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in (HISTORY_FILE, broker_final.FINAL_FILE, "report.json", "report.md"):
        (out / stale).unlink(missing_ok=True)
    run_id = secrets.token_hex(3)
    found = capabilities.check(run_id)
    if not found.ok:
        raise SetupFailed(found.explain())
    groups = group_names(config.groups)
    hosts = cluster_hosts(groups, config.nodes, config.namesrvs)
    info = run_info(config, run_id, found.netem)
    state = _State()
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix=f"dlc-{run_id}-") as scratch:
        info["scratch"] = scratch
        (out / "run.json").write_text(json.dumps(info, indent=2) + "\n")
        network = Network(run_id, hosts)
        target = BrokerTarget(
            Path(scratch),
            network,
            groups=groups,
            replicas=config.nodes,
            namesrvs=config.namesrvs,
            broker_args=broker_args(config),
        )
        try:
            network.setup()
            with (
                HistoryWriter(out / HISTORY_FILE, RunClock(), keep=False) as history,
                entered_namespace(network.bridge_namespace),
                _harness_log(out / HARNESS_LOG),
            ):
                trio.run(_drive, config, target, network, history, state, progress)
        except NetworkError as err:
            raise SetupFailed(str(err)) from err
        except BaseException as exc:
            setup = find(exc, (SetupFailed, TargetStartFailed))
            if setup is not None:
                raise SetupFailed(str(setup)) from exc
            raise
        finally:
            with signals_blocked():
                state.finish(target)
                target.stop_all()
                _keep_files(target, out, keep_stores=config.keep_stores)
                problems = network.teardown()
            if problems:
                print("dledger-chaos: cleanup problems: " + "; ".join(problems), file=progress)
        broker_final.save(out / broker_final.FINAL_FILE, state.final)
    return out, check_saved_broker(out)


def check_saved_broker(out: Path) -> dict[str, Any]:
    """Judge a saved broker run and write its report; the report."""
    state = broker_final.load(out / broker_final.FINAL_FILE)
    run_json = out / "run.json"
    info = json.loads(run_json.read_text()) if run_json.exists() else {}
    evaluation = broker_checks.evaluate(iter_history(out / HISTORY_FILE), state)
    return broker_report.write(out, evaluation, info)


async def _drive(
    config: RunConfig,
    target: BrokerTarget,
    network: Network,
    history: HistoryWriter,
    state: _State,
    progress: TextIO,
) -> None:
    async with trio.open_nursery() as root:
        root.start_soon(watch_signals, root.cancel_scope, state)
        try:
            with trio.fail_after(config.duration_s * (1 + RUN_SLACK_RATIO) + RUN_SLACK_S):
                await _run_target(config, target, network, history, state, progress)
        except trio.TooSlowError:
            state.notes.append("the run hung: not done long after its duration")
        root.cancel_scope.cancel()


async def _run_target(
    config: RunConfig,
    target: BrokerTarget,
    network: Network,
    history: HistoryWriter,
    state: _State,
    progress: TextIO,
) -> None:
    async with target.started():
        workload = MessageWorkload(
            target.namesrv_addr,
            target.groups,
            random.Random(f"{config.seed}/workload"),
            target.host_at,
            producers=config.workers,
            send_timeout_s=config.op_timeout_s,
        )
        try:
            await workload.create_topics(TOPICS_TIMEOUT_S)
        except Exception as exc:  # the admin's nursery wraps what its block raised
            err = find(exc, (trio.TooSlowError, MQClientError))
            if err is None:
                raise
            raise SetupFailed(
                f"the topics were not created within {TOPICS_TIMEOUT_S} s: {err!r}"
            ) from exc
        history.clock.restart()  # t = 0: the workload starts
        faults = plan(
            config.scenario,
            random.Random(f"{config.seed}/plan"),
            config.interval_s,
            BROKER_SCENARIOS,
        )
        nemesis = ClusterNemesis(target, network, history, faults)
        stop_sending, stop_consuming = trio.Event(), trio.Event()
        async with trio.open_nursery() as watch:
            watch.start_soon(_progress, history, workload, nemesis, target, progress)
            async with trio.open_nursery() as consumers:
                consumers.start_soon(workload.run_consumers, history, stop_consuming)
                async with trio.open_nursery() as producers:
                    producers.start_soon(workload.run_producers, history, stop_sending)
                    await nemesis.run(until_s=config.duration_s)
                    await trio.sleep(max(QUIET_S, config.duration_s - history.clock.elapsed_s()))
                    stop_sending.set()  # each sender finishes the send it has in flight
                    producers.cancel_scope.deadline = (
                        trio.current_time() + config.op_timeout_s + QUIET_S
                    )
                if not await workload.wait_drained(DRAIN_TIMEOUT_S):
                    state.notes.append(
                        f"consumers not drained within {DRAIN_TIMEOUT_S} s: {workload.missing()}"
                    )
                stop_consuming.set()
                consumers.cancel_scope.deadline = trio.current_time() + CONSUMER_STOP_S
            watch.cancel_scope.cancel()
        if progress.isatty():
            print(file=progress)
        history.flush()
        target.check_crashes(history.clock.now_ns())
        converged = await target.wait_converged(CONVERGE_TIMEOUT_S)
        final = await target.read_final(workload.queues())
        state.final = attrs.evolve(final, converged=converged)


async def _progress(
    history: HistoryWriter,
    workload: MessageWorkload,
    nemesis: ClusterNemesis,
    target: BrokerTarget,
    out: TextIO,
) -> None:
    tty = out.isatty()
    every = PROGRESS_TTY_S if tty else PROGRESS_LOG_S
    while True:
        await trio.sleep(every)
        history.flush()
        for crash in target.check_crashes(history.clock.now_ns()):
            print(f"\n{crash.node} exited by itself ({crash.returncode})", file=out)
        c = workload.counts
        consumed = " ".join(f"{g.removeprefix('chaos_')} {c[g]}" for g in workload.consumed)
        line = (
            f"{history.clock.elapsed_s():7.1f} s  sent ok {c['ok']} fail {c['fail']} "
            f"info {c['info']}  consumed {consumed}  faults {nemesis.injected}  "
            f"now: {nemesis.current or 'no fault'}"
        )
        print(
            ("\r" + line.ljust(120)) if tty else line, end="" if tty else "\n", file=out, flush=True
        )


def broker_args(config: RunConfig) -> list[str]:
    """Every broker replica's arguments beyond its identity: BROKER_ARGS, and --flush."""
    return [*BROKER_ARGS, *(["--flush", config.flush] if config.flush else [])]


def run_info(config: RunConfig, run_id: str, netem: str | None) -> dict[str, Any]:
    return {
        "target": "broker",
        "scenario": config.scenario,
        "seed": config.seed,
        "groups": config.groups,
        "nodes": config.nodes,
        "namesrvs": config.namesrvs,
        "duration_s": config.duration_s,
        "workers": config.workers,
        "op_timeout_s": config.op_timeout_s,
        "interval_s": list(config.interval_s or interval_for(config.scenario)),
        "run_id": run_id,
        "isolation": ISOLATION,
        "netem": "available, not used yet" if netem is None else f"not available: {netem}",
        "broker_args": broker_args(config),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "command": " ".join(sys.argv),
    }


@contextlib.contextmanager
def _harness_log(path: Path) -> Iterator[None]:
    """The clients' log lines (producers, consumers, admin) go to `path`, not the terminal."""
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
        handler.close()


def _keep_files(target: BrokerTarget, out: Path, *, keep_stores: bool) -> None:
    logs = out / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    for path in target.log_paths():
        if path.exists():
            shutil.copy2(path, logs / path.name)
    if keep_stores:
        stores = out / "stores"
        shutil.rmtree(stores, ignore_errors=True)
        for group in target.groups:
            for host in target.group_hosts(group):
                source = target.store_dir(host)
                if source.exists():
                    shutil.copytree(source, stores / group / target.raft_id(host))
