"""One chaos run, start to end (the broker target's run is chaos/broker_run.py): check the machine, build the network, start the target, run
the workload and the nemesis for the duration, heal, let it settle, read every replica back,
judge, report; and on every way out (success, failure, timeout, Ctrl-C, SIGTERM) stop every
process by pid, delete every namespace by name and remove the scratch directory.

runs/<name>/ gets run.json (parameters), history.jsonl, final.json (what the replicas held),
report.json, report.md, timeline.png, logs/ (each replica's log) and, with --keep-stores,
stores/ (each replica's files, for dledger-audit).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio

from chaos import capabilities, checks, final, report
from chaos.broker_run import check_saved_broker, run_broker
from chaos.history import HISTORY_FILE, HistoryWriter, RunClock, read_history
from chaos.nemesis import Nemesis
from chaos.net import Network, NetworkError, entered_namespace, remove_run_namespaces
from chaos.run_config import (
    Outcome,
    RunConfig,
    SetupFailed,
    cleanup_on_signals,
    signals_blocked,
    watch_signals,
)
from chaos.schedule import interval_for, plan
from chaos.targets.base import TargetStartFailed
from chaos.targets.dledger import SERVER_ARGS, DLedgerTarget, node_names
from chaos.workloads.append import AppendWorkload
from dledger.exceptions import find

RUN_JSON = "run.json"
LEADER_START_S = 30.0  # a fresh group elects a leader within this, or the run cannot start
QUIET_S = 2.0  # the workload goes on this long on the healed cluster after the last fault
CONVERGE_TIMEOUT_S = 30.0  # with writes stopped, replicas reach one commit index by then
RUN_SLACK_S = 180.0  # beyond the duration (start, last recovery, final read): then it is hung
RUN_SLACK_RATIO = 0.25  # and this share of the duration: the final read grows with the log
PROGRESS_TTY_S = 0.5
PROGRESS_LOG_S = 5.0  # when stderr is not a terminal, a progress line this often
ISOLATION = "a network namespace per replica, veth pairs to a bridge in its own namespace; iptables DROP rules in each replica's namespace"


@attrs.define
class _State:
    interrupted: str | None = None  # the signal that stopped the run
    final: final.FinalState = final.NO_FINAL_READ

    def finish(self, target: DLedgerTarget) -> None:
        """What the run found about the replicas, however it ended."""
        problems = self.final.problems
        if self.interrupted is not None and not self.final.complete:
            problems = (f"interrupted by {self.interrupted} before the final read",)
        crashes = tuple(c.describe() for c in target.crashes)
        self.final = attrs.evolve(self.final, problems=problems, crashes=crashes)


def run(config: RunConfig, progress: TextIO = sys.stderr) -> Outcome:
    config.validate()
    if config.target == "broker":
        _, judged = run_broker(config, progress)
        return Outcome(judged["verdict"], judged)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in (HISTORY_FILE, final.FINAL_FILE, report.REPORT_JSON, report.REPORT_MD):
        (out / stale).unlink(missing_ok=True)
    run_id = secrets.token_hex(3)
    found = capabilities.check(run_id)
    if not found.ok:
        raise SetupFailed(found.explain())
    nodes = node_names(config.nodes)
    info = _run_info(config, run_id, found.netem)
    state = _State()
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix=f"dlc-{run_id}-") as scratch:
        info["scratch"] = scratch
        (out / RUN_JSON).write_text(json.dumps(info, indent=2) + "\n")
        network = Network(run_id, nodes)
        target = DLedgerTarget(Path(scratch), network)
        try:
            network.setup()
            with (
                HistoryWriter(out / HISTORY_FILE, RunClock(), keep=False) as history,
                entered_namespace(network.bridge_namespace),
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
        final.save(out / final.FINAL_FILE, state.final)
    return check_saved(out)


def check_saved(out: Path) -> Outcome:
    """Judge a saved run (history.jsonl, final.json, run.json) and write its report."""
    history_path = out / HISTORY_FILE
    if not history_path.exists():
        raise SetupFailed(f"{history_path} does not exist: not a chaos run directory")
    run_json = out / RUN_JSON
    info = json.loads(run_json.read_text()) if run_json.exists() else {}
    if info.get("target") == "broker":
        judged = check_saved_broker(out)
        return Outcome(judged["verdict"], judged)
    history = read_history(history_path)
    state = final.load(out / final.FINAL_FILE)
    evaluation = checks.evaluate(history, state)
    written = report.write(out, history, evaluation, info)
    return Outcome(evaluation.verdict, written)


def cleanup_saved(out: Path) -> list[str]:
    """What a run left behind when it could not clean up itself (the harness was killed with
    -9): its namespaces and what runs in them, and its scratch directory, found by the names
    recorded in run.json. Returns what was removed."""
    run_json = out / RUN_JSON
    if not run_json.exists():
        raise SetupFailed(f"{run_json} does not exist: not a chaos run directory")
    info = json.loads(run_json.read_text())
    removed, problems = remove_run_namespaces(str(info["run_id"]))
    scratch = Path(str(info.get("scratch", "")))
    if info.get("scratch") and scratch.exists():
        shutil.rmtree(scratch)
        removed.append(str(scratch))
    if problems:
        raise SetupFailed("; ".join(problems))
    return removed


async def _drive(
    config: RunConfig,
    target: DLedgerTarget,
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
            state.final = attrs.evolve(
                state.final, problems=("the run hung: not done long after its duration",)
            )
        root.cancel_scope.cancel()


async def _run_target(
    config: RunConfig,
    target: DLedgerTarget,
    network: Network,
    history: HistoryWriter,
    state: _State,
    progress: TextIO,
) -> None:
    async with target.started():
        if await target.wait_leader(LEADER_START_S) is None:
            raise SetupFailed(f"the group elected no leader within {LEADER_START_S} s")
        history.clock.restart()  # t = 0: the workload starts
        workload = AppendWorkload(
            target.peers,
            random.Random(f"{config.seed}/workload"),
            workers=config.workers,
            op_timeout_s=config.op_timeout_s,
        )
        faults = plan(config.scenario, random.Random(f"{config.seed}/plan"), config.interval_s)
        nemesis = Nemesis(target, network, history, faults)
        stop = trio.Event()
        async with trio.open_nursery() as watch:
            watch.start_soon(_progress, history, workload, nemesis, target, progress)
            async with trio.open_nursery() as work:
                work.start_soon(workload.run, history, stop)
                await nemesis.run(until_s=config.duration_s)
                await trio.sleep(max(QUIET_S, config.duration_s - history.clock.elapsed_s()))
                stop.set()  # each worker finishes the append it has in flight
                work.cancel_scope.deadline = trio.current_time() + config.op_timeout_s + QUIET_S
            watch.cancel_scope.cancel()
        _end_progress(progress)
        history.flush()
        target.check_crashes(history.clock.now_ns())
        converged = await target.wait_converged(CONVERGE_TIMEOUT_S)
        state.final = attrs.evolve(await target.read_final(), converged=converged)


async def _progress(
    history: HistoryWriter,
    workload: AppendWorkload,
    nemesis: Nemesis,
    target: DLedgerTarget,
    out: TextIO,
) -> None:
    tty = out.isatty()
    every = PROGRESS_TTY_S if tty else PROGRESS_LOG_S
    while True:
        await trio.sleep(every)
        history.flush()
        for crash in target.check_crashes(history.clock.now_ns()):
            print(f"\nreplica {crash.node} exited by itself ({crash.returncode})", file=out)
        c = workload.counts
        line = (
            f"{history.clock.elapsed_s():7.1f} s  ok {c['ok']}  fail {c['fail']}  "
            f"info {c['info']}  faults {nemesis.injected}  now: {nemesis.current or 'no fault'}"
        )
        print(
            ("\r" + line.ljust(100)) if tty else line, end="" if tty else "\n", file=out, flush=True
        )


def _end_progress(out: TextIO) -> None:
    if out.isatty():
        print(file=out)


def _run_info(config: RunConfig, run_id: str, netem: str | None) -> dict[str, Any]:
    return {
        "target": config.target,
        "scenario": config.scenario,
        "seed": config.seed,
        "nodes": config.nodes,
        "duration_s": config.duration_s,
        "workers": config.workers,
        "op_timeout_s": config.op_timeout_s,
        "interval_s": list(config.interval_s or interval_for(config.scenario)),
        "run_id": run_id,
        "isolation": ISOLATION,
        "netem": "available, not used yet" if netem is None else f"not available: {netem}",
        "server_args": SERVER_ARGS,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "command": " ".join(sys.argv),
    }


def _keep_files(target: DLedgerTarget, out: Path, *, keep_stores: bool) -> None:
    logs = out / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    for replica in target.local.replicas.values():
        if replica.log_path.exists():
            shutil.copy2(replica.log_path, logs / replica.log_path.name)
    if keep_stores:
        stores = out / "stores"
        shutil.rmtree(stores, ignore_errors=True)
        for node, replica in target.local.replicas.items():
            if replica.store_dir.exists():
                shutil.copytree(replica.store_dir, stores / node)
