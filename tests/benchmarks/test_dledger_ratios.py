"""bench.dledger's arithmetic and flags: ratios to stored or same-session peer figures."""

from __future__ import annotations

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
