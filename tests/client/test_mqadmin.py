"""`mqadmin` as users run it: the real command line in a subprocess against a real local cluster
(2 name servers, 2 broker groups x 3 replicas, started once for the module), each command's
table and `--json` output, and the error cases: unknown command, missing or bad flag (exit 2),
unreachable name servers and refusals (exit 1), each one line on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from broker.localcluster import SMALL_STORE_ARGS, LocalCluster, running_cluster
from client.instance import open_instance

GROUPS = ("broker-a", "broker-b")
CLUSTER = "DefaultCluster"
CLI_TIMEOUT_S = 60.0


@attrs.frozen
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self.err
        return json.loads(self.out)

    def lines(self) -> list[str]:
        assert self.code == 0, self.err
        return self.out.splitlines()

    def one_error_line(self) -> str:
        """The failure's single stderr line (asserting there is exactly one, no traceback)."""
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        assert "Traceback" not in self.err and not self.out
        return lines[0]


def env(namesrv_env: str | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    if namesrv_env is not None:
        out["NAMESRV_ADDR"] = namesrv_env
    return out


def command(args: tuple[str, ...], namesrv: str | None) -> list[str]:
    return [sys.executable, "-m", "client.mqadmin", *args, *(["-n", namesrv] if namesrv else [])]


def mqadmin(*args: str, namesrv: str | None = None, namesrv_env: str | None = None) -> Result:
    done = subprocess.run(
        command(args, namesrv),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env(namesrv_env),
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


async def mqadmin_async(*args: str, namesrv: str) -> Result:
    """The same from a trio test, whose loop must keep running meanwhile (its heartbeats)."""
    done = await trio.run_process(
        command(args, namesrv), capture_stdout=True, capture_stderr=True, check=False, env=env()
    )
    return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def header(text: str) -> list[str]:
    """The column names of a table's first line."""
    return [h.strip() for h in text.splitlines()[0].split("#") if h.strip()]


def rows(text: str) -> list[list[str]]:
    """A table's body, split into cells (cells hold no double spaces)."""
    return [[c.strip() for c in line.split("  ") if c.strip()] for line in text.splitlines()[1:]]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("mqadmin")
    with running_cluster(
        root, groups=GROUPS, replicas=3, namesrvs=2, extra_broker_args=SMALL_STORE_ARGS
    ) as running:
        yield running


@pytest.fixture(scope="module")
def n(cluster: LocalCluster) -> str:
    return cluster.namesrv_addr


# --- the command line itself ---------------------------------------------------------------------


def test_overview_lists_every_command_and_each_has_help() -> None:
    overview = mqadmin()
    assert overview.code == 0
    for name in ("clusterList", "updateTopic", "queryMsgById", "leadershipTransfer"):
        assert name in overview.out
    assert mqadmin("-h").out == overview.out
    helped = mqadmin("updateTopic", "-h")
    assert helped.code == 0 and "--clusterName" in helped.out and "--writeQueueNums" in helped.out
    assert mqadmin("help", "updateTopic").out == helped.out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("noSuchCommand",), ["unknown command", "noSuchCommand"]),
        (("-n", "127.0.0.1:9876", "topicList"), ["the command comes first"]),
        (("topicStatus",), ["topicStatus", "-t/--topic", "required"]),
        (("updateTopic", "-c", CLUSTER), ["-t/--topic", "required"]),
        (("updateTopic", "-t", "T"), ["-c/--clusterName", "-b/--brokerAddr"]),
        (("updateTopic", "-c", CLUSTER, "-b", "127.0.0.1:1", "-t", "T"), ["not allowed with"]),
        (("updateTopic", "-c", CLUSTER, "-t", "T", "-r", "abc"), ["-r/--readQueueNums", "abc"]),
        (("updateTopic", "-c", CLUSTER, "-t", "T", "-w", "0"), ["-w/--writeQueueNums", "1..1024"]),
        (("updateTopic", "-c", CLUSTER, "-t", "T", "-o", "maybe"), ["-o/--order", "maybe"]),
        (("queryMsgByOffset", "-t", "T", "-b", "b", "-i", "0", "-o", "-1"), ["-o/--offset"]),
        (("resetOffsetByTime", "-g", "G", "-t", "T", "-s", "yesterday"), ["-s/--timestamp"]),
        (("topicList", "-n", "nohostport"), ["-n/--namesrvAddr", "nohostport"]),
        (("leadershipTransfer", "-g", "broker-a"), ["-t/--target"]),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2(args: tuple[str, ...], words: list[str]) -> None:
    result = mqadmin(*args)
    assert result.code == 2, result
    line = result.one_error_line()
    assert line.startswith("mqadmin")
    for word in words:
        assert word in line, line


def test_unreachable_name_servers_are_one_line_and_exit_1() -> None:
    dead = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    for args in (("topicList",), ("clusterList", "--json"), ("topicStatus", "-t", "T")):
        result = mqadmin(*args, namesrv=dead)
        assert result.code == 1, result
        line = result.one_error_line()
        for address in dead.split(";"):
            assert address in line, line


def test_namesrv_comes_from_the_environment(n: str) -> None:
    assert "TBW102" in mqadmin("topicList", namesrv_env=n).lines()


# --- name servers and topics ---------------------------------------------------------------------


def test_cluster_list(cluster: LocalCluster, n: str) -> None:
    table = mqadmin("clusterList", namesrv=n)
    assert header(table.out)[:5] == ["Cluster Name", "Broker Name", "BID", "Addr", "Version"]
    body = rows(table.out)
    assert len(body) == 6
    for group in GROUPS:
        mine = [r for r in body if r[1] == group]
        assert {r[3] for r in mine} == set(cluster.broker_addresses(group))
        assert [r[5] for r in mine if r[2] == "0"] == ["leader"]
    members = mqadmin("clusterList", "-c", CLUSTER, "--json", namesrv=n).json()
    assert len(members) == 6 and {m["cluster"] for m in members} == {CLUSTER}
    leaders = {m["broker_name"]: m["address"] for m in members if m["broker_id"] == 0}
    assert leaders == {g: cluster.leader_of(g) for g in GROUPS}
    assert all(m["runtime"]["raftRole"] in ("leader", "follower") for m in members)
    unknown = mqadmin("clusterList", "-c", "NoCluster", namesrv=n)
    assert unknown.code == 1 and "NoCluster" in unknown.one_error_line()


def test_topic_create_route_status_delete(cluster: LocalCluster, n: str) -> None:
    created = mqadmin(
        "updateTopic", "-c", CLUSTER, "-t", "AdminTopic", "-r", "4", "-w", "4", namesrv=n
    )
    assert sorted(created.lines()) == sorted(
        f"create topic to {cluster.leader_of(g)} ({g}) success." for g in GROUPS
    )
    assert "AdminTopic" in mqadmin("topicList", namesrv=n).lines()
    route = mqadmin("topicRoute", "-t", "AdminTopic", namesrv=n)
    assert header(route.out) == [
        "Cluster Name", "Broker Name", "Broker Addrs", "Read Queue", "Write Queue", "Perm"
    ]  # fmt: skip
    assert [r[1:2] + r[3:] for r in rows(route.out)] == [
        ["broker-a", "4", "4", "6"],
        ["broker-b", "4", "4", "6"],
    ]
    as_json = mqadmin("topicRoute", "-t", "AdminTopic", "--json", namesrv=n).json()
    assert {b["broker_name"] for b in as_json["broker_datas"]} == set(GROUPS)
    status = mqadmin("topicStatus", "-t", "AdminTopic", namesrv=n)
    assert header(status.out) == ["Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"]
    assert [r[:4] for r in rows(status.out)] == [
        [g, str(q), "0", "0"] for g in GROUPS for q in range(4)
    ]
    queues = mqadmin("topicStatus", "-t", "AdminTopic", "--json", namesrv=n).json()
    assert len(queues) == 8 and all(q["max_offset"] == 0 for q in queues)

    # -b: one broker; a follower's address works too (it forwards to its leader)
    follower = next(
        a for a in cluster.broker_addresses("broker-a") if a != cluster.leader_of("broker-a")
    )
    one = mqadmin(
        "updateTopic",
        "-b",
        follower,
        "-t",
        "OneBrokerTopic",
        "-w",
        "2",
        "-r",
        "2",
        "--json",
        namesrv=n,
    )
    assert one.json() == [{"broker_name": "broker-a", "address": follower}]
    only_a = mqadmin("topicRoute", "-t", "OneBrokerTopic", "--json", namesrv=n).json()
    assert [q["broker_name"] for q in only_a["queue_datas"]] == ["broker-a"]

    deleted = mqadmin("deleteTopic", "-c", CLUSTER, "-t", "AdminTopic", namesrv=n)
    assert deleted.lines()[-1] == "delete topic [AdminTopic] from NameServer success."
    assert "AdminTopic" not in mqadmin("topicList", namesrv=n).lines()
    gone = mqadmin("topicRoute", "-t", "AdminTopic", namesrv=n)
    assert gone.code == 1 and "AdminTopic" in gone.one_error_line()
    assert mqadmin("topicStatus", "-t", "AdminTopic", namesrv=n).code == 1
    wrong = mqadmin("deleteTopic", "-c", "NoCluster", "-t", "OneBrokerTopic", namesrv=n)
    assert wrong.code == 1 and f"clusters: {CLUSTER}" in wrong.one_error_line()


# --- messages ------------------------------------------------------------------------------------


def send(n: str, topic: str, body: str, *extra: str) -> dict[str, Any]:
    sent: dict[str, Any] = mqadmin(
        "sendMessage", "-t", topic, "-p", body, *extra, "--json", namesrv=n
    ).json()
    return sent


def test_send_and_query_messages(n: str) -> None:
    mqadmin("updateTopic", "-c", CLUSTER, "-t", "MsgTopic", "-r", "2", "-w", "2", namesrv=n).lines()
    table = mqadmin(
        "sendMessage",
        "-t",
        "MsgTopic",
        "-p",
        "hello",
        "-k",
        "order-1 order-2",
        "-c",
        "TagA",
        namesrv=n,
    )
    assert header(table.out) == [
        "Broker Name",
        "QID",
        "Queue Offset",
        "Send Result",
        "MsgId",
        "Offset Msg ID",
    ]
    broker, qid, offset, result, uniq, offset_id = rows(table.out)[0]
    assert result == "SEND_OK" and broker in GROUPS
    second = send(n, "MsgTopic", "world", "-k", "order-1", "-b", "broker-b", "-i", "1")
    assert second["queue"] == {"topic": "MsgTopic", "broker_name": "broker-b", "queue_id": 1}

    # by offsetMsgId: the store host answers
    by_offset_id = mqadmin("queryMsgById", "-i", offset_id, namesrv=n)
    fields = dict(line.split(":", 1) for line in by_offset_id.lines())
    fields = {k: v.strip() for k, v in fields.items()}
    assert fields["Message Body"] == "hello" and fields["Tags"] == "[TagA]"
    assert fields["Keys"] == "[order-1 order-2]" and fields["MsgId"] == uniq
    assert (fields["Broker Name"], fields["Queue ID"], fields["Queue Offset"]) == (
        broker,
        qid,
        offset,
    )
    # by UNIQ_KEY: needs the topic
    [found] = mqadmin(
        "queryMsgById", "-i", second["msg_id"], "-t", "MsgTopic", "--json", namesrv=n
    ).json()
    assert (
        found["message"]["body"] == "world"
        and found["message"]["offset_msg_id"] == second["offset_msg_id"]
    )
    no_topic = mqadmin("queryMsgById", "-i", second["msg_id"], namesrv=n)
    assert no_topic.code == 1 and "-t" in no_topic.one_error_line()
    not_hex = mqadmin("queryMsgById", "-i", "XYZ", "-t", "MsgTopic", namesrv=n)
    assert not_hex.code == 1 and "XYZ" in not_hex.one_error_line()

    # by key: both messages carry order-1, newest first
    keyed = mqadmin("queryMsgByKey", "-t", "MsgTopic", "-k", "order-1", namesrv=n)
    assert header(keyed.out)[:2] == ["Message ID", "Offset Msg ID"]
    assert {r[0] for r in rows(keyed.out)} == {second["msg_id"], uniq}
    stored = [r[-1] for r in rows(keyed.out)]
    assert stored == sorted(stored, reverse=True)  # newest first
    only = mqadmin("queryMsgByKey", "-t", "MsgTopic", "-k", "order-2", "--json", namesrv=n).json()
    assert [f["message"]["body"] for f in only] == ["hello"]
    assert (
        mqadmin("queryMsgByKey", "-t", "MsgTopic", "-k", "nope", "--json", namesrv=n).json() == []
    )
    # within a time range (the IndexFile keeps whole seconds, as RocketMQ's), and the newest N
    both = mqadmin("queryMsgByKey", "-t", "MsgTopic", "-k", "order-1", "--json", namesrv=n).json()
    newest, oldest = (f["message"]["store_timestamp_ms"] for f in both)
    for window, wanted in [
        (("-b", str(oldest - 2000), "-e", str(newest + 1000)), [second["msg_id"], uniq]),
        (("-b", str(newest + 1000)), []),
        (("-e", str(oldest - 2000)), []),
        (("-m", "1"), [second["msg_id"]]),
    ]:
        found = mqadmin(
            "queryMsgByKey", "-t", "MsgTopic", "-k", "order-1", *window, "--json", namesrv=n
        ).json()
        assert [f["message"]["msg_id"] for f in found] == wanted, window
    too_many = mqadmin("queryMsgByKey", "-t", "MsgTopic", "-k", "order-1", "-m", "65", namesrv=n)
    assert too_many.code == 2 and "65" in too_many.err

    # by queue offset
    at = mqadmin(
        "queryMsgByOffset",
        "-t",
        "MsgTopic",
        "-b",
        "broker-b",
        "-i",
        "1",
        "-o",
        str(second["queue_offset"]),
        "--json",
        namesrv=n,
    ).json()
    assert at["message"]["body"] == "world" and at["message"]["msg_id"] == second["msg_id"]
    past = mqadmin(
        "queryMsgByOffset", "-t", "MsgTopic", "-b", "broker-b", "-i", "1", "-o", "999", namesrv=n
    )
    assert past.code == 1 and "999" in past.one_error_line()
    wrong = mqadmin(
        "queryMsgByOffset", "-t", "MsgTopic", "-b", "broker-x", "-i", "0", "-o", "0", namesrv=n
    )
    assert wrong.code == 1 and "broker-x" in wrong.one_error_line()
    no_topic_send = mqadmin("sendMessage", "-t", "NoSuchTopic", "-p", "x", namesrv=n)
    assert no_topic_send.code == 1 and "NoSuchTopic" in no_topic_send.one_error_line()


def test_print_messages_by_offset_and_time(n: str) -> None:
    mqadmin(
        "updateTopic", "-c", CLUSTER, "-t", "PrintTopic", "-r", "1", "-w", "1", namesrv=n
    ).lines()
    first = [send(n, "PrintTopic", f"early-{i}", "-b", "broker-a") for i in range(3)]
    [stored] = mqadmin("queryMsgById", "-i", first[-1]["offset_msg_id"], "--json", namesrv=n).json()
    boundary_ms = stored["message"]["store_timestamp_ms"] + 1
    deadline = time.monotonic() + 5
    while time.time_ns() // 1_000_000 <= boundary_ms and time.monotonic() < deadline:
        pass  # the next store time is on this host's clock: let it pass the boundary
    later = [send(n, "PrintTopic", f"late-{i}", "-b", "broker-a") for i in range(2)]

    every = mqadmin("printMsg", "-t", "PrintTopic", namesrv=n).lines()
    assert [line.rsplit("BODY: ", 1)[1] for line in every] == [
        "early-0", "early-1", "early-2", "late-0", "late-1"
    ]  # fmt: skip
    assert all(line.startswith("MSGID: ") for line in every)
    bounded = mqadmin("printMsg", "-t", "PrintTopic", "-m", "2", namesrv=n).lines()
    assert len(bounded) == 3 and "first 2 messages" in bounded[-1]
    window = mqadmin(
        "printMsg",
        "-t",
        "PrintTopic",
        "--beginOffset",
        "1",
        "--endOffset",
        "3",
        "--json",
        namesrv=n,
    ).json()
    assert [f["message"]["body"] for f in window] == ["early-1", "early-2"]
    since = mqadmin(
        "printMsg", "-t", "PrintTopic", "-b", str(boundary_ms), "--json", namesrv=n
    ).json()
    assert [f["message"]["body"] for f in since] == ["late-0", "late-1"]
    until = mqadmin(
        "printMsg", "-t", "PrintTopic", "-e", str(boundary_ms), "--json", namesrv=n
    ).json()
    assert [f["message"]["body"] for f in until] == ["early-0", "early-1", "early-2"]
    assert {m["msg_id"] for m in first + later} == {
        f["message"]["msg_id"]
        for f in mqadmin("printMsg", "-t", "PrintTopic", "--json", namesrv=n).json()
    }


# --- consumer groups -----------------------------------------------------------------------------


def test_subscription_group_progress_and_reset(n: str) -> None:
    group = "admin_progress_cg"
    created = mqadmin("updateSubGroup", "-c", CLUSTER, "-g", group, "-r", "3", namesrv=n)
    assert len(created.lines()) == 2 and all("success." in line for line in created.lines())
    mqadmin("updateTopic", "-c", CLUSTER, "-t", "LagTopic", "-r", "2", "-w", "2", namesrv=n).lines()
    for i in range(5):
        send(n, "LagTopic", f"m{i}")
    none_yet = mqadmin("consumerProgress", "-g", group, namesrv=n)
    assert none_yet.code == 1 and group in none_yet.one_error_line()

    reset = mqadmin("resetOffsetByTime", "-g", group, "-t", "LagTopic", "-s", "0", namesrv=n)
    assert header(reset.out) == ["brokerName", "queueId", "oldOffset", "offset"]
    assert {r[-1] for r in rows(reset.out)} == {"0"} and len(rows(reset.out)) == 4
    progress = mqadmin("consumerProgress", "-g", group, namesrv=n)
    assert progress.lines()[-1] == "Diff Total: 5"
    assert header(progress.out) == [
        "Topic",
        "Broker Name",
        "QID",
        "Broker Offset",
        "Consumer Offset",
        "Diff",
        "LastTime",
    ]
    table = [r for r in rows(progress.out) if r and r[0] == "LagTopic"]
    assert len(table) == 4 and sum(int(r[3]) for r in table) == 5
    assert all(r[4] == "0" and r[5] == r[3] for r in table)

    now = mqadmin(
        "resetOffsetByTime", "-g", group, "-t", "LagTopic", "-s", "now", "--json", namesrv=n
    ).json()
    assert sum(r["new_offset"] for r in now) == 5 and {r["old_offset"] for r in now} == {0}
    caught_up = mqadmin(
        "consumerProgress", "-g", group, "-t", "LagTopic", "--json", namesrv=n
    ).json()
    assert caught_up["diff_total"] == 0 and caught_up["group"] == group
    assert sum(q["consumer_offset"] for q in caught_up["queues"]) == 5

    deleted = mqadmin("deleteSubGroup", "-c", CLUSTER, "-g", group, namesrv=n)
    assert all(line.startswith("delete subscription group from") for line in deleted.lines())


async def test_consumer_connection(n: str) -> None:
    group = "admin_connection_cg"
    member = {
        "groupName": group,
        "consumeType": "CONSUME_PASSIVELY",
        "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
        "subscriptionDataSet": [{"topic": "TBW102", "subString": "TagA || TagB", "subVersion": 1}],
        "unitMode": False,
    }
    async with open_instance(n, instance_name="connection-probe") as instance:
        assert await instance.refresh("TBW102") is not None  # every broker is in its route
        instance.heartbeat_parts.append(lambda: {"consumerDataSet": [member]})
        await instance.send_heartbeats()
        table = await mqadmin_async("consumerConnection", "-g", group, namesrv=n)
        assert table.code == 0, table.err
        lines = table.out.splitlines()
        assert header(table.out) == ["ClientId", "ClientAddr", "Language", "Version"]
        assert lines[1].split()[:2] == ["1", instance.client_id]
        assert "Below is subscription:" in lines
        assert lines[lines.index("Below is subscription:") + 2].split(None, 2) == [
            "1",
            "TBW102",
            "TagA || TagB",
        ]
        assert (
            "MessageModel: CLUSTERING" in lines
            and "ConsumeFromWhere: CONSUME_FROM_FIRST_OFFSET" in lines
        )
        as_json = await mqadmin_async("consumerConnection", "-g", group, "--json", namesrv=n)
        found = as_json.json()
        assert [c["client_id"] for c in found["clients"]] == [instance.client_id]
        assert found["subscriptions"] == [{"topic": "TBW102", "expression": "TagA || TagB"}]
    offline = await mqadmin_async("consumerConnection", "-g", "nobody_cg", namesrv=n)
    assert offline.code == 1 and "CONSUMER_NOT_ONLINE" in offline.one_error_line()


# --- brokers -------------------------------------------------------------------------------------


def test_broker_status_and_config(cluster: LocalCluster, n: str) -> None:
    leader = cluster.leader_of("broker-a")
    assert leader is not None
    lines = mqadmin("brokerStatus", "-b", leader, namesrv=n).lines()
    status = {k.strip(): v.strip() for k, v in (line.split(": ", 1) for line in lines)}
    assert status["brokerName"] == "broker-a" and status["raftRole"] == "leader"
    # pending half messages of transactions (none here: the count and the oldest's age)
    assert status["transactionHalfPending"] == "0"
    assert status["transactionHalfOldestAgeMs"] == "0"
    everyone = mqadmin("brokerStatus", "-c", CLUSTER, "--json", namesrv=n).json()
    assert sorted(s["address"] for s in everyone) == sorted(
        a for g in GROUPS for a in cluster.broker_addresses(g)
    )
    config = mqadmin("getBrokerConfig", "-b", leader, namesrv=n).lines()
    assert config[0] == f"============{leader}============"
    properties = {k.strip(): v.strip() for k, v in (line.split("=  ", 1) for line in config[1:])}
    assert (
        properties["brokerName"] == "broker-a"
        and properties["listenPort"] == leader.rsplit(":", 1)[1]
    )
    assert len(properties["dLegerPeers"].split(";")) == 3
    configs = mqadmin("getBrokerConfig", "-c", CLUSTER, "--json", namesrv=n).json()
    assert len(configs) == 6 and {c["properties"]["brokerClusterName"] for c in configs} == {
        CLUSTER
    }
    dead = mqadmin("brokerStatus", "-b", f"127.0.0.1:{free_port()}", namesrv=n)
    assert dead.code == 1 and "127.0.0.1:" in dead.one_error_line()


def test_leadership_transfer(cluster: LocalCluster, n: str) -> None:
    group = "broker-b"
    before = cluster.leader_name(group)
    assert before is not None
    leader_node = before.split("/")[1]
    target = next(r.node for r in cluster.replicas_of(group) if r.node != leader_node)
    target_addr = cluster.brokers[f"{group}/{target}"].client_addr
    moved = mqadmin("leadershipTransfer", "-g", group, "-t", target, namesrv=n).lines()
    assert len(moved) == 1
    assert moved[0].startswith(f"leadership of {group} moved from {leader_node} to {target} (term ")
    assert moved[0].endswith(f", master {target_addr})")
    # the name servers list the new master already: the command waited for that
    assert cluster.leader_of(group) == target_addr
    again = mqadmin("leadershipTransfer", "-g", group, "-t", target, "--json", namesrv=n).json()
    assert again["previous_leader"] == again["leader"] == target and again["address"] == target_addr
    assert again["term"] >= 2
    bad = mqadmin("leadershipTransfer", "-g", group, "-t", "n9", namesrv=n)
    assert bad.code == 1 and "n0, n1, n2" in bad.one_error_line()
    unknown = mqadmin("leadershipTransfer", "-g", "broker-x", "-t", "n1", namesrv=n)
    assert unknown.code == 1 and "broker-x" in unknown.one_error_line()


def test_commands_go_on_when_replicas_die(cluster: LocalCluster, n: str) -> None:
    """Last in the module: it kills processes. A dead follower shows as unreachable; with a
    group's master killed, reads go to its other replicas (a message the dead master stored is
    found by its offsetMsgId on another), and a change goes through a follower to the new
    leader."""
    mqadmin(
        "updateTopic", "-c", CLUSTER, "-t", "SurviveTopic", "-r", "2", "-w", "2", namesrv=n
    ).lines()
    sent = send(n, "SurviveTopic", "survives", "-b", "broker-a")
    master = cluster.leader_name("broker-a")
    assert master is not None
    stored_by = cluster.brokers[master].client_addr
    [before] = mqadmin("queryMsgById", "-i", sent["offset_msg_id"], "--json", namesrv=n).json()
    assert before["address"] == stored_by

    follower = next(
        r for r in cluster.replicas_of("broker-b") if r.client_addr != cluster.leader_of("broker-b")
    )
    cluster.kill(follower.name)
    listed = mqadmin("clusterList", "--json", namesrv=n).json()
    dead = [m for m in listed if m["address"] == follower.client_addr]
    assert len(dead) == 1 and dead[0]["error"] and dead[0]["runtime"] == {}
    table = mqadmin("clusterList", namesrv=n)
    assert [r[5] for r in rows(table.out) if r[3] == follower.client_addr] == ["unreachable"]

    cluster.kill(master)
    [found] = mqadmin("queryMsgById", "-i", sent["offset_msg_id"], "--json", namesrv=n).json()
    assert found["message"]["body"] == "survives" and found["address"] != stored_by
    status = mqadmin("topicStatus", "-t", "SurviveTopic", "--json", namesrv=n).json()
    assert sum(q["max_offset"] for q in status if q["queue"]["broker_name"] == "broker-a") == 1
    changed = mqadmin(
        "updateTopic",
        "-c",
        CLUSTER,
        "-t",
        "SurviveTopic",
        "-r",
        "3",
        "-w",
        "3",
        "--json",
        namesrv=n,
    ).json()
    assert {c["broker_name"] for c in changed} == set(GROUPS)
    assert stored_by not in {c["address"] for c in changed}
