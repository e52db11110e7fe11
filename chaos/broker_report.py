"""A broker run's report: report.json (stable keys), report.md (for people, per broker group)
and timeline.png (SEND_OKs and consumptions per 100 ms per group, the faults shaded).

report.json keys (BROKER_REPORT_KEYS; new ones are only added):
  verdict, reasons       "pass" | "fail" | "unknown", and why it is not a pass
  acked                  sends acknowledged SEND_OK
  sends                  {invoke, ok, fail, info}
  acked_lost             acknowledged, in no queue of the group's log            must be 0
  acked_misplaced        in the log, not at the acknowledged queue offset        must be 0
  acked_unconsumed       {consumer group: acknowledged values never consumed}    must be 0
  consumed_not_stored    consumed values the log does not hold where consumed    must be 0
  order_violations       per-key order after dedupe, orderly group               must be 0
  keys_checked           sharding keys the order check saw
  queue_problems         replica queues with holes, other messages, other ends  must be 0
  rewinds_beyond_bound   rewinds below a durably committed offset                 must be 0
  failed_in_log          values whose every send failed, in the log              must be 0
  unexpected_in_log      values in the log nobody sent                           must be 0
  process_crashes        processes that exited unbidden                          must be 0
  duplicates_in_log      extra copies in the logs (re-sends after unknown outcomes)   counted
  unknown_in_log         `info` sends that landed                                     counted
  consumed               {consumer group: distinct values consumed}
  redelivered            {consumer group: values consumed again}                     counted
  rewinds                {count, by_cause: {cause: {rewinds, redelivered, max_depth}}}
  failover_ms            {p50, p99, max, count} over faults that hit a group's leader
  failover_ms_by_kind    the same per fault kind, over every fault of the kind
  faults                 {kind: count}
  groups                 per broker group: acked, lost, misplaced, unconsumed,
                         redelivered, queue_problems, duplicates_in_log,
                         longest_no_ok_ms (+ at_s), faults, failover_ms
  final_read, converged  every replica read at the end; they had applied the same index
  details                samples of every finding, every failover and rewind
  run                    run.json
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from chaos import availability
from chaos.broker_checks import Evaluation, Failover, RewindFinding
from chaos.broker_scan import SAMPLES_MAX
from chaos.history import HISTORY_FILE, NEMESIS, Op, Phase, iter_history
from chaos.report import recoveries

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
TIMELINE_PNG = "timeline.png"
BIN_S = 0.1
BROKER_REPORT_KEYS = (
    "verdict",
    "reasons",
    "acked",
    "sends",
    "acked_lost",
    "acked_misplaced",
    "acked_unconsumed",
    "consumed_not_stored",
    "order_violations",
    "keys_checked",
    "queue_problems",
    "rewinds_beyond_bound",
    "failed_in_log",
    "unexpected_in_log",
    "process_crashes",
    "duplicates_in_log",
    "unknown_in_log",
    "consumed",
    "redelivered",
    "rewinds",
    "failover_ms",
    "failover_ms_by_kind",
    "faults",
    "groups",
    "final_read",
    "converged",
    "details",
    "run",
)


def rewinds_by_cause(rewinds: Sequence[RewindFinding]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rewinds:
        row = out.setdefault(r.cause, {"rewinds": 0, "redelivered": 0, "max_depth": 0})
        row["rewinds"] += 1
        row["redelivered"] += r.rewind.count
        row["max_depth"] = max(row["max_depth"], r.rewind.depth)
    return dict(sorted(out.items()))


def failover_summary(found: Sequence[Failover]) -> dict[str, Any]:
    as_log_level = [
        availability.Failover(f.number, f.kind, f.leader_affected, f.ms, None) for f in found
    ]
    return availability.failover_summary(as_log_level)


def _rewind_row(r: RewindFinding) -> dict[str, Any]:
    return {
        **attrs.asdict(r.rewind),
        "take_ns": r.take_ns,
        "committed_before": r.committed_before,
        "cause": r.cause,
        "beyond_bound": r.beyond_bound,
    }


def build(e: Evaluation, run: dict[str, Any], nemesis: Sequence[Op]) -> dict[str, Any]:
    checked = e.final_read

    def count(n: int) -> int | None:
        return n if checked else None

    summary = failover_summary(e.failovers)
    beyond = [r for r in e.rewinds if r.beyond_bound]
    report: dict[str, Any] = {
        "verdict": e.verdict,
        "reasons": list(e.reasons),
        "acked": e.acked,
        "sends": e.sends,
        "acked_lost": count(len(e.lost)),
        "acked_misplaced": count(len(e.misplaced)),
        "acked_unconsumed": e.unconsumed_count,
        "consumed_not_stored": count(e.phantom_count),
        "order_violations": len(e.order),
        "keys_checked": e.keys_checked,
        "queue_problems": count(len(e.queue_problems)),
        "rewinds_beyond_bound": len(beyond),
        "failed_in_log": count(len(e.failed_in_log)),
        "unexpected_in_log": count(len(e.unexpected_in_log)),
        "process_crashes": len(e.crashes),
        "duplicates_in_log": count(sum(e.duplicates_in_log.values())),
        "unknown_in_log": count(e.unknown_in_log),
        "consumed": e.consumed,
        "redelivered": e.redelivered,
        "rewinds": {"count": len(e.rewinds), "by_cause": rewinds_by_cause(e.rewinds)},
        "failover_ms": summary["overall"],
        "failover_ms_by_kind": summary["by_kind"],
        "faults": dict(sorted(Counter(w.kind for w in e.windows).items())),
        "groups": {g: attrs.asdict(f) for g, f in e.groups.items()},
        "final_read": e.final_read,
        "converged": e.converged,
        "details": {
            "lost": [attrs.asdict(x) for x in e.lost[:SAMPLES_MAX]],
            "misplaced": [attrs.asdict(x) for x in e.misplaced[:SAMPLES_MAX]],
            "unconsumed": {cg: [attrs.asdict(x) for x in us] for cg, us in e.unconsumed.items()},
            "consumed_not_stored": [attrs.asdict(x) for x in e.phantoms],
            "order": [attrs.asdict(x) for x in e.order[:SAMPLES_MAX]],
            "queue_problems": [attrs.asdict(x) for x in e.queue_problems[:SAMPLES_MAX]],
            "rewinds_beyond_bound": [_rewind_row(r) for r in beyond[:SAMPLES_MAX]],
            "rewinds": [_rewind_row(r) for r in e.rewinds[: SAMPLES_MAX * 5]],
            "failed_in_log": list(e.failed_in_log[:SAMPLES_MAX]),
            "unexpected_in_log": list(e.unexpected_in_log[:SAMPLES_MAX]),
            "crashes": list(e.crashes),
            "failovers": [attrs.asdict(f) for f in e.failovers],
            "recoveries": recoveries(nemesis),
            "history_problems": list(e.history_problems),
            "notes": list(e.notes),
        },
        "run": run,
    }
    assert tuple(report) == BROKER_REPORT_KEYS, tuple(report)
    return report


def write(out: Path, e: Evaluation, run: dict[str, Any]) -> dict[str, Any]:
    nemesis = [op for op in iter_history(out / HISTORY_FILE) if op.process == NEMESIS]
    report = build(e, run, nemesis)
    (out / REPORT_JSON).write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / REPORT_MD).write_text(markdown(report, e))
    from chaos.timeline import draw_series  # matplotlib is slow to import; only when drawing

    series, end_s = rates(iter_history(out / HISTORY_FILE))
    draw_series(out / TIMELINE_PNG, series, end_s, e.windows, "per 100 ms")
    return report


def rates(history: Iterable[Op]) -> tuple[dict[str, list[int]], float]:
    """Per 100 ms bin: SEND_OKs per broker group ("sent ok broker-a") and consumed messages
    per consumer group ("consumed chaos_orderly")."""
    counts: dict[str, Counter[int]] = defaultdict(Counter)
    end_ns = 0
    for op in history:
        end_ns = max(end_ns, op.time_ns)
        b = int(op.time_ns / 1e9 / BIN_S)
        if op.f == "send" and op.phase is Phase.OK:
            counts[f"sent ok {op.group}"][b] += 1
        elif op.f == "consume":
            counts[f"consumed {op.value['cg']}"][b] += len(op.value["m"])
    size = int(end_ns / 1e9 / BIN_S) + 1
    series = {name: [c.get(i, 0) for i in range(size)] for name, c in sorted(counts.items())}
    return series, size * BIN_S


def _fmt(value: Any) -> str:
    return "n/a" if value is None else str(value)


def markdown(report: dict[str, Any], e: Evaluation) -> str:
    run = report["run"]
    lines = [
        f"# Broker chaos run: {run.get('scenario', '?')} (seed {run.get('seed', '?')})",
        "",
        f"**Verdict: {report['verdict'].upper()}**"
        + (f" ({'; '.join(report['reasons'])})" if report["reasons"] else ""),
        "",
        f"{run.get('groups', '?')} broker groups x {run.get('nodes', '?')} replicas, "
        f"{run.get('namesrvs', '?')} name servers, {run.get('duration_s', '?')} s, "
        f"{run.get('workers', '?')} plain senders, send timeout {run.get('op_timeout_s', '?')} s; "
        f"isolation: {run.get('isolation', '?')}; tc netem: {run.get('netem', '?')}.",
        "",
        "## Checks",
        "",
        "| check | result | must |",
        "|---|---|---|",
    ]
    rows = [
        ("acknowledged sends (SEND_OK)", report["acked"], ""),
        ("acknowledged but lost", report["acked_lost"], "0"),
        ("acknowledged at another offset", report["acked_misplaced"], "0"),
        *(
            (f"acknowledged, never consumed by {cg}", n, "0")
            for cg, n in report["acked_unconsumed"].items()
        ),
        ("consumed but not stored there", report["consumed_not_stored"], "0"),
        (
            f"per-key order violations (orderly, {report['keys_checked']} keys)",
            report["order_violations"],
            "0",
        ),
        ("replica queue problems (holes, other messages, ends)", report["queue_problems"], "0"),
        ("consumer rewinds below a durable commit", report["rewinds_beyond_bound"], "0"),
        ("failed sends in the log", report["failed_in_log"], "0"),
        ("unexpected messages in the log", report["unexpected_in_log"], "0"),
        ("process crashes", report["process_crashes"], "0"),
        ("duplicates in the log", report["duplicates_in_log"], ""),
        ("unknown outcomes in the log", report["unknown_in_log"], ""),
        *((f"redelivered to {cg}", n, "") for cg, n in report["redelivered"].items()),
        ("final read of every replica", report["final_read"], "true"),
        ("replicas converged before the read", report["converged"], ""),
    ]
    lines += [f"| {name} | {_fmt(value)} | {must} |" for name, value, must in rows]
    s = report["sends"]
    lines += [
        "",
        f"Sends: {s['invoke']} invoked, {s['ok']} ok, {s['fail']} fail, {s['info']} info "
        f"(unknown). Consumed (distinct): "
        + ", ".join(f"{cg} {n}" for cg, n in report["consumed"].items())
        + ".",
        "",
        "## Per broker group",
        "",
        "| group | acked | lost | misplaced | unconsumed | redelivered | queue problems "
        "| duplicates | longest without SEND_OK | faults | failover p50/p99/max ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g, f in report["groups"].items():
        unconsumed = ", ".join(
            f"{cg.removeprefix('chaos_')} {n}" for cg, n in f["unconsumed"].items()
        )
        redelivered = ", ".join(
            f"{cg.removeprefix('chaos_')} {n}" for cg, n in f["redelivered"].items()
        )
        faults = ", ".join(f"{k} {n}" for k, n in f["faults"].items()) or "none"
        fo = f["failover_ms"]
        gap = (
            "n/a"
            if f["longest_no_ok_ms"] is None
            else f"{f['longest_no_ok_ms']} ms at {f['longest_no_ok_at_s']} s"
        )
        lines.append(
            f"| {g} | {f['acked']} | {f['lost']} | {f['misplaced']} | {unconsumed} | "
            f"{redelivered} | {f['queue_problems']} | {f['duplicates_in_log']} | {gap} | "
            f"{faults} | {_fmt(fo['p50'])}/{_fmt(fo['p99'])}/{_fmt(fo['max'])} |"
        )
    lines += [
        "",
        "## Failover (fault injected -> first SEND_OK on its group of a send invoked after it)",
        "",
        "| kind | count | p50 ms | p99 ms | max ms | no SEND_OK before next fault |",
        "|---|---|---|---|---|---|",
    ]
    overall = report["failover_ms"]
    lines.append(
        f"| all leader faults | {overall['count']} | {_fmt(overall['p50'])} | "
        f"{_fmt(overall['p99'])} | {_fmt(overall['max'])} | |"
    )
    for kind, k in report["failover_ms_by_kind"].items():
        lines.append(
            f"| {kind} | {k['count']} | {_fmt(k['p50'])} | {_fmt(k['p99'])} | {_fmt(k['max'])} "
            f"| {k['no_ok_before_next_fault']} |"
        )
    lines += [
        "",
        "## Fault timeline",
        "",
        "| # | fault | group | start s | healed s | nodes | leader | failover ms | "
        "redelivered after it | recovery |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    failovers = {f.number: f for f in e.failovers}
    by_cause = report["rewinds"]["by_cause"]
    recov = report["details"]["recoveries"]
    for i, w in enumerate(e.windows):
        f = failovers.get(w.number)
        r = recov[i] if i < len(recov) else None
        healed = "-" if w.end_ns is None else f"{w.end_ns / 1e9:.2f}"
        recovery = (
            "-" if r is None else (f"{r.get('ms')} ms" if r["recovered"] else "NOT RECOVERED")
        )
        cause = f"fault {w.number} {w.kind} {w.value.get('group') or ''}".strip()
        redelivered = by_cause.get(cause, {}).get("redelivered", 0)
        ms = None if f is None or f.ms is None else round(f.ms, 1)
        lines.append(
            f"| {w.number} | {w.kind} | {w.value.get('group') or 'namesrv'} | "
            f"{w.start_ns / 1e9:.2f} | {healed} | {','.join(w.value.get('nodes', []))} | "
            f"{_fmt(w.leader)} | {_fmt(ms)} | {redelivered} | {recovery} |"
        )
    lines += [
        "",
        "## Consumer rewinds by cause",
        "",
        "| cause | rewinds | redelivered | deepest (offsets) |",
        "|---|---|---|---|",
    ]
    for cause, row in by_cause.items():
        lines.append(f"| {cause} | {row['rewinds']} | {row['redelivered']} | {row['max_depth']} |")
    details = report["details"]
    for key in (
        "lost",
        "misplaced",
        "consumed_not_stored",
        "order",
        "queue_problems",
        "rewinds_beyond_bound",
        "failed_in_log",
        "unexpected_in_log",
        "crashes",
        "history_problems",
        "notes",
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
    for cg, samples in details["unconsumed"].items():
        if samples:
            lines += ["", f"## never consumed by {cg} (first {SAMPLES_MAX})", "", "```"]
            lines += [json.dumps(x, default=str) for x in samples]
            lines.append("```")
    return "\n".join(lines) + "\n"
