"""bench.broker's arithmetic and flags, without a cluster or a load: the load plan, merging the
load processes' reports, the comparison with bench.dledger's rows and the peers, the targets."""

from __future__ import annotations

import time

import pytest

from bench import broker as bench
from remoting.codes import ResponseCode, SerializeType
from remoting.errors import RemotingError
from remoting.frame import FrameDecoder, encode


@pytest.mark.parametrize(
    ("senders", "expected"),
    [
        (1, [(1, 1)]),
        (2, [(1, 1), (1, 1)]),
        (16, [(8, 1), (8, 1)]),
        (10, [(5, 1), (5, 1)]),
        (17, [(5, 1), (4, 1), (4, 1), (4, 1)]),
        (128, [(32, 1)] * 4),
    ],
)
def test_the_plan_spreads_senders_over_processes_and_connections(
    senders: int, expected: list[tuple[int, int]]
) -> None:
    assert bench.plan(senders) == expected
    assert sum(n for n, _ in bench.plan(senders)) == senders


def report(acked: int, t_start: float, t_end: float, latencies: list[float], **codes: int) -> dict:
    return {
        "acked": acked,
        "errors": sum(codes.values()),
        "error_codes": codes,
        "t_start": t_start,
        "t_end": t_end,
        "latencies_ms": latencies,
    }


def test_processes_combine_over_the_span_from_the_first_start_to_the_last_end() -> None:
    row = bench.combine(
        [
            report(1000, 100.0, 102.0, [1.0] * 98 + [9.0] * 2, RequestTimeout=1),
            report(3000, 100.5, 104.0, [2.0] * 100, **{"2": 3, "RequestTimeout": 2}),
        ]
    )
    assert row["acked"] == 4000
    assert row["seconds"] == 4.0
    assert row["msgs_per_s"] == 1000
    assert row["mb_per_s"] == 1.02  # 4000 x 1024 bytes in 4 s
    assert row["errors"] == 6
    assert row["error_codes"] == {"RequestTimeout": 3, "2": 3}
    # percentiles of the merged latencies, not a mean of each process's
    assert row["latency_p50_ms"] == 2.0
    assert row["latency_p99_ms"] == 9.0


def test_a_row_is_compared_with_dledgers_row_for_the_same_policy_and_count() -> None:
    rows = bench.dledger_rows(
        {
            "throughput": [
                {"flush": "ASYNC_FLUSH", "clients": 16, "entries_per_s": 20_000},
                {"flush": "SYNC_FLUSH", "clients": 16, "entries_per_s": 8_000},
            ]
        }
    )
    assert bench.of_dledger(13_000, "ASYNC_FLUSH", 16, rows) == 0.65
    assert bench.of_dledger(13_000, "SYNC_FLUSH", 16, rows) == 1.62
    assert bench.of_dledger(13_000, "SYNC_FLUSH", 128, rows) is None  # no such row
    assert bench.dledger_rows(None) == {}


def test_ratios_compare_like_durability_and_leave_out_what_is_missing() -> None:
    peers = {
        "nats_jetstream": {"append_msgs_s": 10_000.0},
        "rabbitmq_quorum": {"append_msgs_s": 4_000.0, "failover_ms_p50": 400.0},
    }
    best = {"ASYNC_FLUSH": 25_000, "SYNC_FLUSH": 14_000}
    assert bench.ratios_to(peers, best, {"failover_ms_p50": 100.0}) == {
        "async_vs_nats_jetstream": 2.5,
        "sync_vs_rabbitmq_quorum": 3.5,
        "failover_p50_vs_rabbitmq": 0.25,
    }
    assert bench.ratios_to(peers, {"SYNC_FLUSH": 14_000}, None) == {"sync_vs_rabbitmq_quorum": 3.5}
    assert bench.ratios_to({"nats_jetstream": {"append_msgs_s": None}}, best, None) == {}


def test_targets_met_missed_or_not_measured() -> None:
    rows = [{"of_dledger": 0.9}, {"of_dledger": 0.55}, {"of_dledger": None}]
    met = bench.targets(
        {"async_vs_nats_jetstream": 2.0, "sync_vs_rabbitmq_quorum": 2.9},
        rows,
        {"failover_ms_p99": 499.0},
    )
    assert met == {
        "vs_nats_jetstream_2x": True,
        "vs_rabbitmq_quorum_3x": False,
        "keeps_60pct_of_dledger": False,  # the worst row counts
        "failover_p99_under_500ms": True,
    }
    assert bench.targets({}, [], None) == dict.fromkeys(met)


def test_a_sender_that_lost_its_broker_goes_to_the_route_master_else_the_next_replica() -> None:
    replicas = ["h:1", "h:2", "h:3"]
    assert bench.next_target("h:1", "h:3", replicas) == "h:3"
    assert bench.next_target("h:1", "h:1", replicas) == "h:2"  # the route is stale
    assert bench.next_target("h:3", None, replicas) == "h:1"  # no route: wrap around
    assert bench.next_target("h:9", None, replicas) == "h:1"


def test_defaults_and_quick() -> None:
    full = bench.parse_args([])
    assert (full.seconds, full.kills, full.senders) == (10.0, 20, [1, 16, 128])
    assert full.policies == ["ASYNC_FLUSH", "SYNC_FLUSH"] and full.live == []
    assert not full.dledger_too and full.keep_logs is None
    assert bench.parse_args(["--policies", "", "--kills", "3"]).policies == []  # failover only
    quick = bench.parse_args(["--quick", "--live-peers", "nats_jetstream,rabbitmq_quorum"])
    assert (quick.seconds, quick.kills) == (3.0, 5)
    assert quick.live == ["nats_jetstream", "rabbitmq_quorum"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--live-peers", "nats_jetstream,kafka"], "unknown kafka"),
        (["--kills", "-1"], "--kills must be >= 0"),
        (["--policies", "ASYNC_FLUSH,FSYNC"], "unknown FSYNC"),
        (["--senders", "1,x"], "a comma list of counts"),
        (["--senders", "0"], "every count >= 1"),
        (["--seconds", "-2"], "--seconds must be > 0"),
    ],
)
def test_bad_flags_exit_2_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_cpu_per_message_splits_the_load_the_leader_and_the_followers() -> None:
    before = {"client": 1.0, "namesrv-0": 5.0, "broker-a-n0": 10.0, "broker-a-n1": 3.0,
              "broker-a-n2": 4.0, "gone": 1.0}  # fmt: skip
    after = {"client": 1.0, "namesrv-0": 5.01, "broker-a-n0": 10.5, "broker-a-n1": 3.1,
             "broker-a-n2": 4.2}  # fmt: skip
    cpu = bench.cpu_per_message(before, after, 10_000, "broker-a-n0", load_s=0.4)
    assert cpu == {"load": 40.0, "leader": 50.0, "followers": [10.0, 20.0], "total": 121.0}
    # nothing acknowledged: per one message, not a division by zero
    assert bench.cpu_per_message(before, before, 0, "broker-a-n0", 0.0)["total"] == 0.0


def test_a_load_request_from_its_template_is_send_request_with_its_opaque() -> None:
    requests = bench._Requests(b"body")
    decoder = FrameDecoder()
    for opaque in (1, 9, 12345, 2**31 - 1):
        decoder.feed(requests.frame(5, opaque))
        (command,) = list(decoder.commands())
        expected = bench.send_request(5, b"body")
        assert command.code == expected.code and command.opaque == opaque
        assert command.body == b"body"
        fields = dict(command.ext_fields)
        assert abs(int(fields.pop("bornTimestamp")) - time.time() * 1000) < 60_000
        assert fields == {k: v for k, v in expected.ext_fields.items() if k != "bornTimestamp"}


def test_answers_are_read_whole_frames_at_a_time() -> None:
    request = bench.send_request(0, b"").with_opaque(41)
    ok = encode(
        request.response(ResponseCode.SUCCESS, ext_fields={"queueId": "0"}).answering(request)
    )
    busy = encode(
        request.with_opaque(42)
        .response(ResponseCode.SYSTEM_BUSY, "busy")
        .answering(request.with_opaque(42))
    )
    buffer = bytearray(ok + busy + ok[:10])
    assert bench._answers(buffer) == [(41, ResponseCode.SUCCESS), (42, ResponseCode.SYSTEM_BUSY)]
    assert buffer == ok[:10]
    buffer += ok[10:]
    assert bench._answers(buffer) == [(41, ResponseCode.SUCCESS)] and not buffer
    binary = encode(
        request.response(ResponseCode.SUCCESS)._replace(serialization=SerializeType.ROCKETMQ)
    )
    with pytest.raises(RemotingError, match="serialization 1"):
        bench._answers(bytearray(binary))


def test_batching_is_counted_over_the_load_and_missing_counters_give_none() -> None:
    before = {
        "sendRequests": 100,
        "sendAppends": 50,
        "raftProposals": 10,
        "raftProposedEntries": 60,
    }
    after = {
        "sendRequests": 400,
        "sendAppends": 150,
        "raftProposals": 20,
        "raftProposedEntries": 360,
    }
    assert bench.batching_per_request(before, after) == {
        "requests_per_append": 3.0,
        "entries_per_proposal": 30.0,
    }
    assert bench.batching_per_request({}, after) == {
        "requests_per_append": None,
        "entries_per_proposal": None,
    }
    assert bench.batching_per_request(before, before)["entries_per_proposal"] is None
