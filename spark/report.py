"""report.json (stable keys), report.html (a table per group, a chart) and the stdout summary.

report.json keys, always present: verdict, exit_code, master, stores, history, elapsed_s,
entries_checked, tasks, groups, replicas, commit_index, findings, broker. `broker` is null
unless some replica is a broker store; then (spark/broker_job.py `tables`) `replicas` (per
broker replica: applied_index from its broker-state, messages in its log, queues, cq_files,
cq_units, index_files, index_items, index_end), `consumer_offsets` (group -> [[consumer group,
topic, queue, offset]] of its most applied replica) and, with a history, `history`
(acknowledged_sends, consumed, last_committed_offsets). `findings` maps every kind
that occurred to {severity, count, examples}; a consistent audit has an empty map.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Sequence
from typing import Any

from spark.job import Outcome
from spark.layout import Replica

EXIT_CONSISTENT, EXIT_INCONSISTENT, EXIT_UNREADABLE = 0, 1, 2
VERDICTS = {
    EXIT_CONSISTENT: "consistent",
    EXIT_INCONSISTENT: "inconsistent",
    EXIT_UNREADABLE: "unreadable",
}


def exit_code(outcome: Outcome) -> int:
    severities = {c["severity"] for c in outcome.counts}
    if "unreadable" in severities:
        return EXIT_UNREADABLE
    return EXIT_INCONSISTENT if "error" in severities else EXIT_CONSISTENT


def build(
    outcome: Outcome,
    replicas: Sequence[Replica],
    *,
    master: str,
    stores: Sequence[str],
    history: str | None,
    elapsed_s: float,
) -> dict[str, Any]:
    code = exit_code(outcome)
    spans = {(s["group"], s["replica"]): s for s in outcome.spans}
    groups: dict[str, dict[str, Any]] = {}
    for r in replicas:
        g = groups.setdefault(r.group, {"group": r.group, "replicas": [], "commit_index": 0})
        g["replicas"].append(r.name)
        g["commit_index"] = max(g["commit_index"], r.commit_index)
    for g in groups.values():
        g["quorum"] = len(g["replicas"]) // 2 + 1
    findings: dict[str, dict[str, Any]] = {}
    for c in outcome.counts:
        findings[c["kind"]] = {"severity": c["severity"], "count": c["count"], "examples": []}
    for e in outcome.examples:
        findings[e["kind"]]["examples"].append(
            {
                k: e.get(k)
                for k in (
                    "group",
                    "replica",
                    "index",
                    "last_index",
                    "count",
                    "file",
                    "position",
                    "detail",
                )
            }
        )
    return {
        "verdict": VERDICTS[code],
        "exit_code": code,
        "master": master,
        "stores": list(stores),
        "history": None if history is None else {"file": history, "acknowledged": outcome.acked},
        "elapsed_s": round(elapsed_s, 3),
        "entries_checked": outcome.entries_checked,
        "tasks": outcome.tasks,
        "groups": [groups[name] for name in sorted(groups)],
        "replicas": [
            {
                "group": r.group,
                "replica": r.name,
                "store": r.uri,
                "entries": int(spans.get((r.group, r.name), {}).get("entries") or 0),
                "first_index": spans.get((r.group, r.name), {}).get("first_index"),
                "last_index": spans.get((r.group, r.name), {}).get("last_index"),
                "bytes": int(spans.get((r.group, r.name), {}).get("bytes") or 0),
                "sound_entries": int(spans.get((r.group, r.name), {}).get("sound_entries") or 0),
                "sound_first_index": spans.get((r.group, r.name), {}).get("sound_first_index"),
                "sound_last_index": spans.get((r.group, r.name), {}).get("sound_last_index"),
                "start_index": r.start_index,
                "commit_index": r.commit_index,
                "applied_index": r.applied_index,
                "segment_bytes": r.segment_bytes,
            }
            for r in replicas
        ],
        "commit_index": {name: groups[name]["commit_index"] for name in sorted(groups)},
        "findings": {kind: findings[kind] for kind in sorted(findings)},
        "broker": outcome.broker,
    }


def summary(report: dict[str, Any]) -> str:
    """The human summary printed on stdout."""
    lines = [
        f"dledger-audit: {report['verdict'].upper()}: {report['entries_checked']} entries of "
        f"{len(report['replicas'])} replicas in {len(report['groups'])} groups checked in "
        f"{report['elapsed_s']:.1f}s"
    ]
    for g in report["groups"]:
        lines.append(
            f"  group {g['group']}: commit index {g['commit_index']}, replicas "
            f"{', '.join(g['replicas'])} (quorum {g['quorum']})"
        )
    for r in report["replicas"]:
        lines.append(f"    {r['group']}/{r['replica']}: {replica_line(r)}")
    for kind, f in report["findings"].items():
        lines.append(f"  {f['severity']:<10} {kind}: {f['count']}")
        for e in f["examples"][:3]:
            at = (
                f"index {e['index']}"
                if e.get("last_index") is None
                else (f"indexes {e['index']}..{e['last_index']}")
            )
            where = "" if e["file"] is None else f" {e['file']} position {e['position']}"
            lines.append(f"      {e['group']}/{e['replica']} {at}{where}: {e['detail']}")
    broker = report.get("broker")
    for b in (broker or {}).get("replicas", []):
        lines.append(f"    broker {b['group']}/{b['replica']}: {broker_line(b)}")
    if broker and "history" in broker:
        h = broker["history"]
        lines.append(
            f"  broker history: {h['acknowledged_sends']} acknowledged sends, "
            f"{h['consumed']} consumed messages checked"
        )
    if report["history"] is not None:
        lines.append(
            f"  history {report['history']['file']}: "
            f"{report['history']['acknowledged']} acknowledged appends"
        )
    return "\n".join(lines)


def replica_line(r: dict[str, Any]) -> str:
    """What was read and sound on a replica, and what its index files claim when that differs
    (a cut or corrupt tail): "1412019 sound entries 1..1412019 (index files claim 1412039
    entries 1..1412039), commit 1412039"."""
    sound = r.get("sound_entries", r["entries"])
    first = r.get("sound_first_index", r["first_index"])
    last = r.get("sound_last_index", r["last_index"])
    read = f"{sound} sound entries"
    if sound:
        read += f" {first}..{last}"
    if (sound, first, last) != (r["entries"], r["first_index"], r["last_index"]):
        claim = f"{r['entries']} entries"
        if r["entries"]:
            claim += f" {r['first_index']}..{r['last_index']}"
        read += f" (index files claim {claim})"
    return f"{read}, commit {r['commit_index']}"


def broker_line(b: dict[str, Any]) -> str:
    """One broker replica's derived files: "applied 412: 230 messages, 4 queues (236 units in
    4 files), 2 index files (310 items)"."""
    applied = "no checkpoint" if b["applied_index"] is None else f"applied {b['applied_index']}"
    return (
        f"{applied}: {b['messages']} messages, {b['queues']} queues ({b['cq_units']} units in "
        f"{b['cq_files']} files), {b['index_files']} index files ({b['index_items']} items)"
    )


def chart_png(report: dict[str, Any]) -> bytes:
    """A bar chart of entries per replica, grouped by group (matplotlib, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    labels = [f"{r['group']}/{r['replica']}" for r in report["replicas"]]
    values = [r["entries"] for r in report["replicas"]]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * len(labels) + 2), 3.2))
    ax.bar(labels, values, color="#4a7ab5")
    ax.set_ylabel("entries")
    ax.set_title("entries per replica")
    ax.tick_params(axis="x", labelrotation=45)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def to_html(report: dict[str, Any]) -> str:
    esc = html.escape

    def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
        head = "".join(f"<th>{esc(h)}</th>" for h in header)
        body = "".join(
            "<tr>" + "".join(f"<td>{esc('' if v is None else str(v))}</td>" for v in row) + "</tr>"
            for row in rows
        )
        return f"<table><tr>{head}</tr>{body}</table>"

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>dledger audit</title>",
        "<style>body{font-family:sans-serif} table{border-collapse:collapse;margin:8px 0}"
        "td,th{border:1px solid #bbb;padding:2px 8px;text-align:left}"
        ".consistent{color:#262} .inconsistent,.unreadable{color:#a22}</style></head><body>",
        f"<h1>dledger audit: <span class='{esc(report['verdict'])}'>"
        f"{esc(report['verdict'])}</span></h1>",
        f"<p>{report['entries_checked']} entries checked in {report['elapsed_s']:.1f}s "
        f"on {esc(report['master'])}</p>",
    ]
    for g in report["groups"]:
        parts.append(
            f"<h2>group {esc(g['group'])}: commit index {g['commit_index']}, "
            f"quorum {g['quorum']}</h2>"
        )
        rows = [
            [
                r["replica"],
                r["entries"],
                r["first_index"],
                r["last_index"],
                r["commit_index"],
                r["applied_index"],
                r["bytes"],
                r["store"],
            ]
            for r in report["replicas"]
            if r["group"] == g["group"]
        ]
        parts.append(
            table(
                ["replica", "entries", "first", "last", "commit", "applied", "bytes", "store"], rows
            )
        )
        found = [
            [kind, f["severity"], e["replica"], e["index"], e["file"], e["position"], e["detail"]]
            for kind, f in report["findings"].items()
            for e in f["examples"]
            if e["group"] == g["group"]
        ]
        if found:
            parts.append(
                table(
                    ["finding", "severity", "replica", "index", "file", "position", "detail"], found
                )
            )
        parts += _broker_html(report, g["group"], table)
    counts = [[k, f["severity"], f["count"]] for k, f in report["findings"].items()]
    parts.append(
        "<h2>findings</h2>"
        + (table(["kind", "severity", "count"], counts) if counts else "<p>none</p>")
    )
    png = base64.b64encode(chart_png(report)).decode("ascii")
    parts.append(
        f"<h2>entries per replica</h2><img alt='entries per replica' "
        f"src='data:image/png;base64,{png}'>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def _broker_html(report: dict[str, Any], group: str, table: Any) -> list[str]:
    """The broker tables of one group: derived files per replica, consumer offsets, and the
    history's last committed offsets."""
    broker = report.get("broker")
    if not broker:
        return []
    rows = [
        [b["replica"], b["applied_index"], b["messages"], b["queues"], b["cq_files"],
         b["cq_units"], b["index_files"], b["index_items"], b["index_end"]]
        for b in broker["replicas"]
        if b["group"] == group
    ]  # fmt: skip
    if not rows:
        return []
    parts = [
        f"<h3>broker {html.escape(group)}: derived files</h3>",
        table(
            [
                "replica",
                "applied",
                "messages",
                "queues",
                "cq files",
                "cq units",
                "index files",
                "index items",
                "index end",
            ],
            rows,
        ),
    ]
    offsets = broker["consumer_offsets"].get(group, [])
    if offsets:
        parts.append(f"<h3>broker {html.escape(group)}: replicated consumer offsets</h3>")
        parts.append(table(["consumer group", "topic", "queue", "offset"], offsets))
    committed = broker.get("history", {}).get("last_committed_offsets", {}).get(group, [])
    if committed:
        parts.append(f"<h3>broker {html.escape(group)}: last committed offsets (history)</h3>")
        parts.append(table(["consumer group", "topic", "queue", "offset"], committed))
    return parts


def write(report: dict[str, Any], out_dir: str) -> None:
    """report.json and report.html under `out_dir`, each written whole then renamed."""
    for name, text in (
        ("report.json", json.dumps(report, indent=2, sort_keys=True) + "\n"),
        ("report.html", to_html(report)),
    ):
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
