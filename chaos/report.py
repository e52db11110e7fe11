"""A run's report: report.json (stable keys, for scripts and CI), report.md (for people) and
timeline.png (ok appends per 100 ms with the fault windows shaded).

report.json keys (REPORT_KEYS, never renamed; new ones are only added):
  verdict            "pass" | "fail" | "unknown" (no complete final read: never a pass)
  reasons            why it is not a pass
  acked              ok appends
  acked_lost         ok appends missing from the final committed log          must be 0
  acked_misplaced    ok appends found, but not at the index acknowledged      must be 0
  order_violations   a client's ok appends out of issue order in the log      must be 0
  replicas_agree     committed entries identical wherever two replicas hold them  must be true
  failed_in_log      `fail` appends that are in the log anyway                must be 0
  unexpected_in_log  log values no client appended                            must be 0
  replica_crashes    replicas that exited without being killed                must be 0
  duplicates         extra copies of values (retries after unknown outcomes)  counted
  unknown_in_log     `info` appends that landed                               counted
  ops                {invoke, ok, fail, info} of client appends
  failover_ms        {p50, p99, max, count} over faults that hit the leader
  failover_ms_by_kind   the same per fault kind, over every fault of the kind
  faults             {kind: count}
  longest_no_ok_ms   the longest stretch without an ok append, and the faults during it
  final_read         every replica's log was read at the end
  uncommitted        entries past each replica's commit index at the end
  details            samples: lost values, violations, divergences, crashes, failovers
  run                the run's parameters (run.json)
The value checks are null when there was no complete final read.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from chaos import availability
from chaos.checks import SAMPLES_MAX, Evaluation
from chaos.history import NEMESIS, Op, Phase

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
TIMELINE_PNG = "timeline.png"
REPORT_KEYS = (
    "verdict",
    "reasons",
    "acked",
    "acked_lost",
    "acked_misplaced",
    "order_violations",
    "replicas_agree",
    "failed_in_log",
    "unexpected_in_log",
    "replica_crashes",
    "duplicates",
    "unknown_in_log",
    "ops",
    "failover_ms",
    "failover_ms_by_kind",
    "faults",
    "longest_no_ok_ms",
    "final_read",
    "uncommitted",
    "details",
    "run",
)


def recoveries(history: Sequence[Op]) -> list[dict[str, Any]]:
    """The nemesis's recovery waits, in order: {"ms": ..., "recovered": bool, ...}."""
    done = [
        op
        for op in history
        if op.process == NEMESIS and op.f == "recover" and op.phase is not Phase.INVOKE
    ]
    return [
        {**(op.value if isinstance(op.value, dict) else {}), "recovered": op.phase is Phase.OK}
        for op in done
    ]


def build(history: Sequence[Op], evaluation: Evaluation, run: dict[str, Any]) -> dict[str, Any]:
    e = evaluation
    checked = e.final_read

    def count(items: Sequence[Any] | dict[str, int]) -> int | None:
        if not checked:
            return None
        return sum(items.values()) if isinstance(items, dict) else len(items)

    windows = availability.fault_windows(history)
    failovers = availability.failovers(history)
    summary = availability.failover_summary(failovers)
    gap = availability.longest_gap(history)
    report: dict[str, Any] = {
        "verdict": e.verdict,
        "reasons": list(e.reasons),
        "acked": e.acked,
        "acked_lost": count(e.lost),
        "acked_misplaced": count(e.misplaced),
        "order_violations": count(e.order),
        "replicas_agree": e.agreement.agree,
        "failed_in_log": count(e.outcomes.failed_in_log),
        "unexpected_in_log": count(e.outcomes.unexpected_in_log),
        "replica_crashes": len(e.crashes),
        "duplicates": count(e.outcomes.duplicates),
        "unknown_in_log": count(e.outcomes.unknown_in_log),
        "ops": e.ops,
        "failover_ms": summary["overall"],
        "failover_ms_by_kind": summary["by_kind"],
        "faults": dict(sorted(Counter(w.kind for w in windows).items())),
        "longest_no_ok_ms": None
        if gap is None
        else {
            "ms": round(gap.ms, 1),
            "at_s": round(gap.start_ns / 1e9, 3),
            "faults": list(gap.faults),
        },
        "final_read": e.final_read,
        "uncommitted": e.agreement.uncommitted,
        "details": {
            "lost": [attrs.asdict(x) for x in e.lost[:SAMPLES_MAX]],
            "misplaced": [attrs.asdict(x) for x in e.misplaced[:SAMPLES_MAX]],
            "order": [attrs.asdict(x) for x in e.order[:SAMPLES_MAX]],
            "divergences": [attrs.asdict(x) for x in e.agreement.divergences],
            "failed_in_log": list(e.outcomes.failed_in_log[:SAMPLES_MAX]),
            "unexpected_in_log": list(e.outcomes.unexpected_in_log[:SAMPLES_MAX]),
            "crashes": list(e.crashes),
            "commit_index": e.agreement.commit_index,
            "failovers": [attrs.asdict(f) for f in failovers],
            "recoveries": recoveries(history),
            "history_problems": list(e.history_problems[:SAMPLES_MAX]),
        },
        "run": run,
    }
    assert tuple(report) == REPORT_KEYS, tuple(report)
    return report


def write(
    out: Path, history: Sequence[Op], evaluation: Evaluation, run: dict[str, Any]
) -> dict[str, Any]:
    report = build(history, evaluation, run)
    (out / REPORT_JSON).write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / REPORT_MD).write_text(markdown(report, history))
    from chaos.timeline import draw  # matplotlib is slow to import; only when drawing

    draw(out / TIMELINE_PNG, history)
    return report


def _round(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)


def _fmt(value: Any) -> str:
    return "n/a" if value is None else str(value)


def markdown(report: dict[str, Any], history: Sequence[Op]) -> str:
    run = report["run"]
    lines = [
        f"# Chaos run: {run.get('scenario', '?')} (seed {run.get('seed', '?')})",
        "",
        f"**Verdict: {report['verdict'].upper()}**"
        + (f" ({'; '.join(report['reasons'])})" if report["reasons"] else ""),
        "",
        f"{run.get('nodes', '?')} replicas, {run.get('duration_s', '?')} s, "
        f"{run.get('workers', '?')} clients, op timeout {run.get('op_timeout_s', '?')} s; "
        f"isolation: {run.get('isolation', '?')}; tc netem: {run.get('netem', '?')}.",
        "",
        "## Checks",
        "",
        "| check | result | must |",
        "|---|---|---|",
    ]
    rows = [
        ("acknowledged appends", report["acked"], ""),
        ("acknowledged but lost", report["acked_lost"], "0"),
        ("acknowledged at another index", report["acked_misplaced"], "0"),
        ("order violations", report["order_violations"], "0"),
        ("replicas agree", report["replicas_agree"], "true"),
        ("failed appends in the log", report["failed_in_log"], "0"),
        ("unexpected entries in the log", report["unexpected_in_log"], "0"),
        ("replica crashes", report["replica_crashes"], "0"),
        ("duplicates", report["duplicates"], ""),
        ("unknown outcomes in the log", report["unknown_in_log"], ""),
        ("final read of every replica", report["final_read"], "true"),
    ]
    lines += [f"| {name} | {_fmt(value)} | {must} |" for name, value, must in rows]
    ops = report["ops"]
    lines += [
        "",
        f"Client appends: {ops['invoke']} invoked, {ops['ok']} ok, {ops['fail']} fail, "
        f"{ops['info']} info (unknown). Uncommitted tails at the end: {report['uncommitted']}.",
        "",
        "## Failover (fault injected -> first ok append on a new leader)",
        "",
        "| kind | count | p50 ms | p99 ms | max ms | no ok before next fault |",
        "|---|---|---|---|---|---|",
    ]
    overall = report["failover_ms"]
    lines.append(
        f"| all leader faults | {overall['count']} | {_fmt(overall['p50'])} | {_fmt(overall['p99'])} | {_fmt(overall['max'])} | |"
    )
    for kind, s in report["failover_ms_by_kind"].items():
        lines.append(
            f"| {kind} | {s['count']} | {_fmt(s['p50'])} | {_fmt(s['p99'])} | {_fmt(s['max'])} | {s['no_ok_before_next_fault']} |"
        )
    gap = report["longest_no_ok_ms"]
    if gap is not None:
        lines += [
            "",
            f"Longest stretch without an ok append: {gap['ms']} ms at {gap['at_s']} s (faults {gap['faults']}).",
        ]
    lines += [
        "",
        "## Fault timeline",
        "",
        "| # | fault | start s | healed s | nodes | leader | failover ms | recovery |",
        "|---|---|---|---|---|---|---|---|",
    ]
    failovers = {f["number"]: f for f in report["details"]["failovers"]}
    recov = report["details"]["recoveries"]
    for i, w in enumerate(availability.fault_windows(history)):
        f = failovers.get(w.number, {})
        r = recov[i] if i < len(recov) else None
        healed = "-" if w.end_ns is None else f"{w.end_ns / 1e9:.2f}"
        recovery = (
            "-" if r is None else (f"{r.get('ms')} ms" if r["recovered"] else "NOT RECOVERED")
        )
        lines.append(
            f"| {w.number} | {w.kind} | {w.start_ns / 1e9:.2f} | {healed} | {','.join(w.value.get('nodes', []))} "
            f"| {_fmt(w.leader)} | {_fmt(_round(f.get('ms')))} | {recovery} |"
        )
    details = report["details"]
    for key in (
        "lost",
        "misplaced",
        "order",
        "divergences",
        "failed_in_log",
        "unexpected_in_log",
        "crashes",
        "history_problems",
    ):
        if details[key]:
            lines += [
                "",
                f"## {key} (first {SAMPLES_MAX})",
                "",
                "```",
                *(json.dumps(x, default=str) for x in details[key]),
                "```",
            ]
    return "\n".join(lines) + "\n"
