"""dledger-audit over broker stores (issue 31's audit): the stores of one short real cluster
(tests/spark/broker_stores.py, built once for the module) pass, with and without their history;
each corruption the issue names, made on a copy, exits 1 and names the replica and the file.

Heavy (real processes and Spark): run under `flock /tmp/heavy.lock`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark import audit
from spark import broker_formats as bf
from tests.spark import broker_stores

QUEUE0 = f"consumequeue/{broker_stores.TOPIC}/0/{0:020d}"
QUEUE1 = f"consumequeue/{broker_stores.TOPIC}/1/{0:020d}"
SCHEDULE = f"consumequeue/SCHEDULE_TOPIC_XXXX/0/{0:020d}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return broker_stores.build(tmp_path_factory.mktemp("broker-audit"))


@pytest.fixture(scope="module")
def healthy(
    spark: SparkSession, built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    # the IndexFile geometry inferred from the files, as an operator would run it
    return run_audit(spark, built[0], tmp_path_factory.mktemp("healthy"), built[1], flags=[])


@pytest.fixture(scope="module")
def broken(
    spark: SparkSession, built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """One audit of a copy with every corruption below, each on its own replica and file, and
    a history with a forged acknowledgement and a forged consumption: one Spark run instead of
    five (the default test run is at its time limit)."""
    root = tmp_path_factory.mktemp("broken")
    stores = root / "stores"
    shutil.copytree(built[0], stores)
    flip_cq_unit_byte(stores / "n1" / QUEUE0, unit=3)
    cut_cq_file(stores / "n2" / SCHEDULE, units=1)
    point_a_slot_nowhere(stores / "n0")
    duplicate_cq_unit(stores / "n0" / QUEUE1, unit=5)
    history = root / "history.jsonl"
    history.write_text(built[1].read_text() + "".join(json.dumps(op) + "\n" for op in FORGED))
    return run_audit(spark, stores, root / "out", history)


def run_audit(
    spark: SparkSession,
    stores: Path,
    out: Path,
    history: Path | None = None,
    flags: list[str] = broker_stores.INDEX_ARGS,
) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """Exit code, report.json and every finding (findings/)."""
    argv = ["--stores", str(stores), "--out", str(out), "--quiet", *flags]
    if history is not None:
        argv += ["--history", str(history)]
    code = audit.main(argv, spark=spark)
    found = [
        json.loads(line)
        for path in sorted((out / "findings").glob("*.json"))
        for line in path.read_text().splitlines()
    ]
    report = json.loads((out / "report.json").read_text())
    report["out"] = str(out)  # for the test: where report.html is
    return code, report, found


def at(found: list[dict[str, Any]], kind: str) -> set[tuple[str | None, str | None]]:
    """(replica, file) of every finding of `kind`."""
    return {(f.get("replica"), f.get("file")) for f in found if f["kind"] == kind}


def on_file(found: list[dict[str, Any]], file: str) -> dict[str, set[str]]:
    """kind -> replicas with a finding of that kind on `file`."""
    out: dict[str, set[str]] = {}
    for f in found:
        if f.get("file") == file:
            out.setdefault(f["kind"], set()).add(f["replica"])
    return out


# --- the corruptions ---------------------------------------------------------------------------
def flip_cq_unit_byte(path: Path, unit: int) -> None:
    """The low bit of the unit's physical offset: it points one byte off, where no message
    starts (two entries are never one byte apart)."""
    data = bytearray(path.read_bytes())
    data[unit * bf.CQ_UNIT_BYTES + 7] ^= 0x01
    path.write_bytes(bytes(data))


def cut_cq_file(path: Path, units: int) -> None:
    """The file cut inside unit `units` (the audit reads whole units only)."""
    path.write_bytes(path.read_bytes()[: units * bf.CQ_UNIT_BYTES + 7])


def duplicate_cq_unit(path: Path, unit: int) -> None:
    """Unit `unit` copied over the next: queue offsets unit and unit+1 name one message."""
    data = bytearray(path.read_bytes())
    n = bf.CQ_UNIT_BYTES
    data[(unit + 1) * n : (unit + 2) * n] = data[unit * n : (unit + 1) * n]
    path.write_bytes(bytes(data))


def point_a_slot_nowhere(store: Path) -> None:
    """The first used slot of the first IndexFile names an item past the file's last."""
    path = sorted((store / "index").iterdir())[0]
    data = bytearray(path.read_bytes())
    header = bf.IndexHeader.decode(bytes(data[: bf.INDEX_HEADER_BYTES]))
    slot = next(s for s in range(SLOTS) if int.from_bytes(data[40 + 4 * s : 44 + 4 * s], "big") > 0)
    data[40 + 4 * slot : 44 + 4 * slot] = (header.index_count + 100).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    NOWHERE.update(file=f"index/{path.name}", position=40 + 4 * slot,
                   item=header.index_count + 100)  # fmt: skip


SLOTS = 1000  # broker_stores.INDEX_ARGS
NOWHERE: dict[str, Any] = {}  # where point_a_slot_nowhere wrote
FORGED = [
    {"type": "ok", "f": "send", "process": "p9", "group": broker_stores.GROUP, "time_ns": 5,
     "value": {"v": "never-sent", "t": broker_stores.TOPIC, "k": None, "id": "X", "q": 0,
               "o": 3, "status": "SEND_OK"}},
    {"type": "ok", "f": "consume", "process": "pull/0", "group": broker_stores.GROUP,
     "time_ns": 6, "value": {"cg": "cg", "t": broker_stores.TOPIC, "q": 1,
                             "m": [[0, "p0-0", ""], [0, "p0-1", ""]]}},
]  # fmt: skip


# --- the tests ---------------------------------------------------------------------------------
def test_the_cluster_s_stores_pass(
    healthy: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    code, report, found = healthy
    assert code == 0, report["findings"]
    assert found == []
    broker = report["broker"]
    assert [r["replica"] for r in broker["replicas"]] == ["n0", "n1", "n2"]
    stored = (
        broker_stores.MESSAGES + 2 * broker_stores.DELAYED
    )  # a schedule record and its delivery
    for r in broker["replicas"]:
        assert r["messages"] == stored and r["cq_units"] == stored, r  # each in one unit
        assert r["queues"] == broker_stores.QUEUES + 1, r  # and SCHEDULE_TOPIC_XXXX
        assert r["index_items"] > broker_stores.MESSAGES, r  # UNIQ_KEYs and KEYS
    sends = broker_stores.MESSAGES + broker_stores.DELAYED
    assert broker["history"]["acknowledged_sends"] == sends
    assert broker["consumer_offsets"][broker_stores.GROUP] == [
        [broker_stores.CONSUMER_GROUP, broker_stores.TOPIC, 0, 16]
    ]
    page = (Path(report["out"]) / "report.html").read_text()
    assert "broker broker-a: derived files" in page
    assert "broker broker-a: replicated consumer offsets" in page


def test_the_broken_copy_exits_1(broken: tuple[int, dict[str, Any], list[dict[str, Any]]]) -> None:
    assert broken[0] == 1


def test_a_flipped_byte_in_a_cq_unit_of_one_replica(
    broken: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _, _, found = broken
    kinds = on_file(found, QUEUE0)
    assert kinds == {
        "cq_unit_dangling": {"n1"}, "cq_divergent": {"n1"}, "message_not_in_cq": {"n1"}
    }, kinds  # fmt: skip
    (dangling,) = [f for f in found if f["kind"] == "cq_unit_dangling"]
    assert dangling["position"] == 3 * bf.CQ_UNIT_BYTES
    assert "queue offset 3" in dangling["detail"]


def test_a_cq_file_cut_on_one_replica(
    broken: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _, _, found = broken
    assert at(found, "cq_file_size") == {("n2", SCHEDULE)}
    kinds = on_file(found, SCHEDULE)
    assert kinds == {"cq_file_size": {"n2"}, "message_not_in_cq": {"n2"}}, kinds
    missing = [f for f in found if f["kind"] == "message_not_in_cq" and f["file"] == SCHEDULE]
    assert sum(f["count"] for f in missing) == broker_stores.DELAYED - 1


def test_an_index_file_slot_pointing_nowhere(
    broken: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _, _, found = broken
    (slot,) = [f for f in found if f["kind"] == "index_slot_dangling"]
    assert (slot["replica"], slot["file"], slot["position"]) == (
        "n0", NOWHERE["file"], NOWHERE["position"]
    )  # fmt: skip
    assert f"names item {NOWHERE['item']}" in slot["detail"]
    assert at(found, "index_item_unreachable") == {("n0", NOWHERE["file"])}
    assert at(found, "index_divergent") == {("n0", NOWHERE["file"])}


def test_a_duplicated_queue_offset(
    broken: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    """Unit 5 copied over unit 6: the message at queue offset 5 is in two slots, the one at 6
    in none, and the unit at 6 points at a record whose queue offset is 5."""
    _, _, found = broken
    kinds = on_file(found, QUEUE1)
    assert kinds == {
        "message_in_cq_twice": {"n0"}, "cq_unit_mismatch": {"n0"}, "cq_divergent": {"n0"},
        "message_not_in_cq": {"n0"},
    }, kinds  # fmt: skip
    (twice,) = [f for f in found if f["kind"] == "message_in_cq_twice"]
    assert twice["replica"] == "n0" and "queue offsets 5, 6" in twice["detail"]
    (mismatch,) = [f for f in found if f["kind"] == "cq_unit_mismatch"]
    assert mismatch["position"] == 6 * bf.CQ_UNIT_BYTES
    assert "the record's queue offset is 5" in mismatch["detail"]


def test_a_lost_send_and_a_consumption_of_nothing_stored(
    broken: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    _, _, found = broken
    (lost,) = [f for f in found if f["kind"] == "lost_message"]
    assert "never-sent" in lost["detail"] and lost["group"] == broker_stores.GROUP
    (wrong,) = [f for f in found if f["kind"] == "consumed_not_stored"]  # p0-0 is in queue 0
    assert "p0-0" in wrong["detail"] and "queue 1, queue offset 0" in wrong["detail"]
    assert not [f for f in found if f["kind"] in ("ack_misplaced", "duplicate_message")]
