"""A broker run's report: stable report.json keys, report.md per group, timeline.png, and
`dledger-chaos check` re-judging a saved broker run (final.json read back as written)."""

from __future__ import annotations

import json
from pathlib import Path

from chaos import broker_final, broker_report
from chaos.broker_run import check_saved_broker
from chaos.cli import main
from chaos.history import write_history
from chaos.workloads.messages import ORDERED_TOPIC
from tests.chaos.broker_histories import BrokerHistory, final_of, key
from tests.chaos.test_broker_checks import CLEAN_QUEUES, clean

# Scripts read these; renaming one breaks them. Add keys at the end, never rename.
STABLE_KEYS = [
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
]


def saved_run(out: Path, h: BrokerHistory, queues: dict[str, list[str]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_history(out / "history.jsonl", h.ops)
    broker_final.save(out / broker_final.FINAL_FILE, final_of({"broker-a": queues}))
    run = {"target": "broker", "scenario": "mixed", "seed": 7, "groups": 1, "nodes": 3}
    (out / "run.json").write_text(json.dumps(run))


def a_run() -> BrokerHistory:
    h = clean().at(100).fault("kill-leader", "kill")
    h.at(150).send("o0", "k1-2", offset=2, topic=ORDERED_TOPIC, key="k1", took_ms=250)
    h.at(2000).fault("kill-leader", "kill", phase="ok", applied_ns=101_000_000, restarted=["n0"])
    h.fault("recover", "recover", phase="invoke").fault("recover", "recover", phase="ok", ms=5)
    h.consume("orderly/0", "chaos_orderly", [(2, "k1-2")], topic=ORDERED_TOPIC)
    return h


def test_report_keys_are_stable_and_say_it_per_group(tmp_path: Path) -> None:
    queues = {**CLEAN_QUEUES, key(0, ORDERED_TOPIC): ["k1-0", "k1-1", "k1-2"]}
    saved_run(tmp_path, a_run(), queues)
    written = check_saved_broker(tmp_path)
    assert list(broker_report.BROKER_REPORT_KEYS) == STABLE_KEYS
    on_disk = json.loads((tmp_path / broker_report.REPORT_JSON).read_text())
    assert list(on_disk) == STABLE_KEYS == list(written)
    assert on_disk["verdict"] == "pass", on_disk["reasons"]
    assert on_disk["faults"] == {"kill-leader": 1}
    assert on_disk["failover_ms"] == {"p50": 300.0, "p99": 300.0, "max": 300.0, "count": 1}
    group = on_disk["groups"]["broker-a"]
    assert group["acked"] == 5 and group["lost"] == 0 and group["faults"] == {"kill-leader": 1}
    md = (tmp_path / broker_report.REPORT_MD).read_text()
    assert "**Verdict: PASS**" in md and "## Per broker group" in md
    assert "| broker-a | 5 | 0 | 0 |" in md
    assert "| 1 | kill-leader | broker-a |" in md
    assert (tmp_path / broker_report.TIMELINE_PNG).stat().st_size > 10_000


def test_check_rejudges_a_saved_broker_run_and_a_lost_message_fails_it(tmp_path: Path) -> None:
    saved_run(tmp_path, clean(), CLEAN_QUEUES)
    assert main(["check", str(tmp_path)]) == 0
    saved_run(tmp_path, clean(), {**CLEAN_QUEUES, key(0): ["p0-0"]})
    assert main(["check", str(tmp_path)]) == 1
    on_disk = json.loads((tmp_path / broker_report.REPORT_JSON).read_text())
    assert on_disk["acked_lost"] == 1 and on_disk["details"]["lost"][0]["value"] == "p0-1"


def test_final_json_round_trips(tmp_path: Path) -> None:
    state = final_of({"broker-a": CLEAN_QUEUES, "broker-b": {key(3): ["p1-0"]}}, converged=False)
    path = tmp_path / "final.json"
    broker_final.save(path, state)
    assert broker_final.load(path) == state
    assert broker_final.load(tmp_path / "missing.json") == broker_final.NO_FINAL_READ


def test_rates_count_sends_and_consumptions_per_100_ms() -> None:
    series, end_s = broker_report.rates(a_run().ops)
    assert set(series) == {
        "sent ok broker-a",
        "consumed chaos_concurrent",
        "consumed chaos_orderly",
        "consumed chaos_pull",
    }
    assert sum(series["sent ok broker-a"]) == 5 and sum(series["consumed chaos_orderly"]) == 3
    assert end_s >= 2.0
