"""bench.dledger's arithmetic and flags: ratios to stored or same-session peer figures."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from bench import dledger as bench


def test_ratios_need_the_figure_and_the_policy_they_compare() -> None:
    peers = {
        "nats_jetstream": {"append_msgs_s": 25_000.0},
        "etcd": {"append_msgs_s": 8_000.0},
        "rabbitmq_quorum": {"failover_ms_p50": 400.0},
    }
    best = {"ASYNC_FLUSH": 60_000, "SYNC_FLUSH": 30_000}
    assert bench.ratios_to(peers, best, {"failover_ms_p50": 20.0}) == {
        "async_vs_nats_jetstream": 2.4,
        "sync_vs_etcd": 3.75,
        "failover_p50_vs_rabbitmq": 0.05,
    }
    # no failover run, no SYNC row, no etcd figure: those ratios are left out, not zero
    assert bench.ratios_to(peers, {"ASYNC_FLUSH": 60_000}, None) == {"async_vs_nats_jetstream": 2.4}
    assert bench.ratios_to({"etcd": {"append_msgs_s": None}}, best, None) == {}


def test_a_live_peer_is_the_mean_of_its_runs_before_and_after() -> None:
    runs = [
        {"append_msgs_s": 24_000.0, "failover_ms_p50": 4_000.0, "failover_ms_max": None},
        {"append_msgs_s": 28_000.0, "failover_ms_p50": 6_000.0, "failover_ms_max": None},
    ]
    summary = bench.live_summary(runs)
    assert summary["append_msgs_s"] == 26_000.0
    assert summary["failover_ms_p50"] == 5_000.0
    assert summary["failover_ms_max"] is None
    assert summary["runs"] == runs


def test_figures_of_reads_either_peer_result_shape() -> None:
    nats = {"publish_async_msgs_s": 12.5, "failover_ms_p50": 1.0, "when": "t"}
    etcd = {"append_msgs_s": 3.5, "failover_ms_max": 2.0}
    assert bench.figures_of(nats)["append_msgs_s"] == 12.5
    assert bench.figures_of(etcd) == {
        "append_msgs_s": 3.5,
        "failover_ms_p50": None,
        "failover_ms_max": 2.0,
        "when": None,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--live-peers", "nats_jetstream,kafka"], "unknown kafka"),
        (["--kills", "-1"], "--kills must be >= 0"),
    ],
)
def test_bad_flags_exit_2_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


FAKE_PEER = """
import json, signal, sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--out") + 1])
mode = sys.argv[1]
if mode == "ok":
    out.write_text(json.dumps({"publish_async_msgs_s": 123.0, "failover_ms_p50": 4.0}))
elif mode == "fail":
    print("nats-server: not found")
    sys.exit(2)
elif mode.startswith("fail-once:"):  # fails the first time only: a marker file remembers
    marker = Path(mode.split(":", 1)[1])
    if not marker.exists():
        marker.write_text("failed")
        print("nats: Duplicate Route")
        sys.exit(1)
    out.write_text(json.dumps({"publish_async_msgs_s": 321.0, "failover_ms_p50": 5.0}))
else:  # hang until told to stop; say that SIGTERM (not SIGKILL) came
    def stop(*_):
        Path(mode).write_text("stopped")
        sys.exit(1)
    signal.signal(signal.SIGTERM, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # one sent early was pending
    signal.pause()
"""


@pytest.fixture
def fake_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "fake.py").write_text(FAKE_PEER)
    monkeypatch.setattr(bench, "PEER_SCRIPTS", tmp_path)
    return tmp_path


def test_a_live_peer_run_gives_its_figures(
    fake_peer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench.LIVE_PEERS, "fake", ["fake.py", "ok"])
    figures = bench.run_peer("fake", fake_peer / "out.json")
    assert figures["append_msgs_s"] == 123.0 and figures["failover_ms_p50"] == 4.0


def test_a_failed_peer_run_raises_with_its_last_words(
    fake_peer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench.LIVE_PEERS, "fake", ["fake.py", "fail"])
    with pytest.raises(RuntimeError, match=r"peer fake exited 2:\nnats-server: not found"):
        bench.run_peer("fake", fake_peer / "out.json")


def test_a_failed_live_run_is_recorded_and_the_other_run_still_counts(
    fake_peer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench.LIVE_PEERS, "fake", ["fake.py", "ok"])
    before = bench.run_peer_or_record("fake", fake_peer / "before.json")
    monkeypatch.setitem(bench.LIVE_PEERS, "fake", ["fake.py", "fail"])
    after = bench.run_peer_or_record("fake", fake_peer / "after.json")
    assert "nats-server: not found" in after["error"]
    summary = bench.live_summary([before, after])
    assert summary["append_msgs_s"] == 123.0 and summary["failover_ms_p50"] == 4.0
    assert summary["runs"] == [before, after]


def test_a_peer_that_fails_once_is_tried_again_and_says_so(
    fake_peer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench.LIVE_PEERS, "fake", ["fake.py", f"fail-once:{fake_peer / 'm'}"])
    figures = bench.run_peer_or_record("fake", fake_peer / "out.json")
    assert figures["append_msgs_s"] == 321.0
    assert "Duplicate Route" in figures["first_try_error"]
    assert bench.live_summary([figures])["append_msgs_s"] == 321.0


def test_a_peer_that_fails_twice_is_recorded_with_both_errors(
    fake_peer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench.LIVE_PEERS, "fake", ["fake.py", "fail"])
    recorded = bench.run_peer_or_record("fake", fake_peer / "out.json")
    assert "nats-server: not found" in recorded["error"]
    assert "nats-server: not found" in recorded["first_try_error"]
    assert "append_msgs_s" not in recorded


def test_a_peer_run_past_its_deadline_is_stopped_with_sigterm(
    fake_peer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = fake_peer / "stopped"
    monkeypatch.setitem(bench.LIVE_PEERS, "fake", ["fake.py", str(marker)])
    monkeypatch.setattr(bench, "PEER_RUN_TIMEOUT_S", 0.5)
    # The child inherits a blocked SIGTERM, so one sent before its handler exists (a slow start
    # on a busy host) waits for the handler instead of killing it.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        with pytest.raises(bench.PeerTimedOut, match="peer fake exited 1"):
            bench.run_peer("fake", fake_peer / "out.json")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    assert marker.read_text() == "stopped"
