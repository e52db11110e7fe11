"""dledger-broker's configuration (broker/config.py): every key from a file, flags over the file,
-m, defaults, and one line plus exit status 2 for every fault an operator can make."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker import config as bc
from broker.config import BrokerConfig, config_from_argv, parse_or_exit
from dledger.config import Address, ConfigError
from dledger.log.store import FlushPolicy

PEERS = "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"
REQUIRED = ["--group", "broker-a", "--self-id", "n0", "--peers", PEERS, "--store", "/tmp/s/n0"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "broker-config.md"

# Every key, each with a value that is not its default.
EVERY_KEY = """\
# a broker.properties using every key
brokerClusterName = RaftCluster
brokerName=RaftNode00
dLegerGroup=RaftNode00
dLegerSelfId=n1
dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913
preferredLeaderId=n2
bindAddress=127.0.0.2
listenPort=30911
brokerIP1=127.0.0.3
namesrvAddr=127.0.0.1:9876;127.0.0.1:9877
registerNameServerPeriod=2000
storePathRootDir=/tmp/rmqstore/node01
flushDiskType=SYNC_FLUSH
fileReservedTime=48
deleteWhen=16
diskMaxUsedSpaceRatio=88
maxMessageSize=65536
defaultTopicQueueNums=4
autoCreateTopicEnable=FALSE
autoCreateSubscriptionGroup=false
enablePropertyFilter=false
messageDelayLevel=1s 500ms 2m 1h 3d
timerMaxDelaySec=3600
transactionTimeOut=3000
transactionCheckInterval=30000
transactionCheckMax=5
mappedFileSizeCommitLog=1048576
cacheTailBytes=0
mappedFileSizeConsumeQueue=20000
maxHashSlotNum=500
maxIndexNum=2000
tickMs=5
heartbeatMs=25
electionTimeoutMs=300
electionTimeoutMaxMs=600
logLevel=debug
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.properties"
    path.write_text(text)
    return path


def fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """parse_or_exit exits 2 with exactly one line on stderr; that line."""
    with pytest.raises(SystemExit) as exit_info:
        parse_or_exit(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("dledger-broker: ")
    return lines[0]


class TestFile:
    def test_every_key(self, tmp_path: Path) -> None:
        """Each key of the file reaches its field."""
        config = config_from_argv(["-c", str(write(tmp_path, EVERY_KEY))])
        assert config == BrokerConfig(
            cluster="RaftCluster",
            group="RaftNode00",
            self_id="n1",
            peers={
                "n0": Address("127.0.0.1", 40911),
                "n1": Address("127.0.0.1", 40912),
                "n2": Address("127.0.0.1", 40913),
            },
            preferred_leader="n2",
            listen=Address("127.0.0.2", 30911),
            broker_ip="127.0.0.3",
            namesrv=(Address("127.0.0.1", 9876), Address("127.0.0.1", 9877)),
            namesrv_heartbeat_ms=2000,
            store_root=Path("/tmp/rmqstore/node01"),
            flush=FlushPolicy.SYNC_FLUSH,
            file_reserved_hours=48.0,
            delete_when_hour=16,
            disk_max_used_percent=88,
            message_bytes_max=65536,
            default_topic_queues=4,
            auto_create_topic=False,
            auto_create_subscription_group=False,
            enable_property_filter=False,
            delay_levels=(1000, 500, 120_000, 3_600_000, 3 * 86_400_000),
            timer_max_delay_s=3600,
            transaction_timeout_ms=3000,
            transaction_check_interval_ms=30000,
            transaction_check_max=5,
            segment_bytes=1 << 20,
            cache_tail_bytes=0,
            consume_queue_file_bytes=20000,
            index_slots=500,
            index_items=2000,
            tick_ms=5,
            heartbeat_ms=25,
            election_timeout_ms_min=300,
            election_timeout_ms_max=600,
            log_level="DEBUG",
        )

    def test_every_key_is_in_the_test_file(self) -> None:
        """EVERY_KEY above really covers every key the broker knows."""
        in_file = {line.split("=")[0].strip() for line in EVERY_KEY.splitlines()[1:]}
        assert in_file == {key.name for key in bc.KEYS}

    def test_rocketmq_dledger_sample(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """RocketMQ's distribution/conf/dledger/broker-n0.conf starts as it is, warning about
        the keys DLedger makes meaningless."""
        sample = (
            "brokerClusterName = RaftCluster\n"
            "brokerName=RaftNode00\n"
            "listenPort=30911\n"
            "namesrvAddr=127.0.0.1:9876\n"
            "storePathRootDir=/tmp/rmqstore/node00\n"
            "storePathCommitLog=/tmp/rmqstore/node00/commitlog\n"
            "enableDLegerCommitLog=true\n"
            "dLegerGroup=RaftNode00\n"
            f"dLegerPeers={PEERS}\n"
            "## must be unique\n"
            "dLegerSelfId=n0\n"
            "sendMessageThreadPoolNums=16\n"
            "brokerRole=ASYNC_MASTER\n"
            "brokerId=0\n"
        )
        path = write(tmp_path, sample)
        with caplog.at_level(logging.WARNING, logger="broker.config"):
            config = config_from_argv(["-c", str(path)])
        assert config.group == "RaftNode00" and config.listen == Address("127.0.0.1", 30911)
        ignored = {"storePathCommitLog", "enableDLegerCommitLog", "sendMessageThreadPoolNums"}
        ignored |= {"brokerRole", "brokerId"}
        assert len(caplog.records) == len(ignored)
        for name in ignored:
            assert any(name in record.getMessage() for record in caplog.records), name

    def test_java_properties_forms(self, tmp_path: Path) -> None:
        """`key=value`, `key: value`, `key value`, # and ! comments, blanks, surrounding space."""
        text = (
            "! a comment\n"
            "   \n"
            "  brokerName :  broker-b  \n"
            "dLegerSelfId n2\n"
            f"dLegerPeers={PEERS}\n"
            "\t# another comment\n"
            "storePathRootDir=  /tmp/s \n"
        )
        config = config_from_argv(["-c", str(write(tmp_path, text))])
        assert (config.group, config.self_id, config.store_root) == (
            "broker-b",
            "n2",
            Path("/tmp/s"),
        )

    def test_dleger_group_alone_names_the_group(self, tmp_path: Path) -> None:
        text = f"dLegerGroup=g1\ndLegerSelfId=n0\ndLegerPeers={PEERS}\nstorePathRootDir=/tmp/s\n"
        assert config_from_argv(["-c", str(write(tmp_path, text))]).group == "g1"


class TestFlags:
    def test_flags_alone(self) -> None:
        config = config_from_argv(
            [*REQUIRED, "--listen", "127.0.0.5:10921", "--namesrv", "127.0.0.1:9876;127.0.0.1:9877"]
        )
        assert config.listen == Address("127.0.0.5", 10921)
        assert config.broker_ip == "127.0.0.5"
        assert config.namesrv == (Address("127.0.0.1", 9876), Address("127.0.0.1", 9877))

    def test_flags_win_over_file(self, tmp_path: Path) -> None:
        path = write(tmp_path, EVERY_KEY)
        argv = ["-c", str(path), "--group", "flagged", "--self-id", "n0", "--listen", "127.0.0.9:1"]
        argv += ["--flush", "ASYNC_FLUSH", "--auto-create-topic", "-n", "127.0.0.1:1"]
        argv += ["--tick-ms", "10", "--heartbeat-ms", "50", "--log-level", "ERROR"]
        config = config_from_argv(argv)
        assert config.group == "flagged"  # over both brokerName and dLegerGroup
        assert config.self_id == "n0"
        assert config.listen == Address("127.0.0.9", 1)  # over bindAddress and listenPort
        assert config.broker_ip == "127.0.0.3"  # the file's, not the new bind host
        assert config.flush is FlushPolicy.ASYNC_FLUSH
        assert config.auto_create_topic is True
        assert config.namesrv == (Address("127.0.0.1", 1),)
        assert (config.tick_ms, config.heartbeat_ms, config.log_level) == (10, 50, "ERROR")
        assert config.cluster == "RaftCluster"  # not given as a flag: the file's

    def test_no_flag_turns_a_default_off(self) -> None:
        config = config_from_argv([*REQUIRED, "--no-auto-create-subscription-group"])
        assert config.auto_create_subscription_group is False


def test_help_names_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_or_exit(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for key in bc.KEYS:
        if key.flag is not None:
            assert key.flag in out and key.name in out, key.name


def test_defaults() -> None:
    config = config_from_argv(REQUIRED)
    assert config.cluster == "DefaultCluster"
    assert config.listen == Address("127.0.0.1", 10911)
    assert config.broker_ip == "127.0.0.1"
    assert config.namesrv == ()
    assert config.namesrv_heartbeat_ms == 3000
    assert config.flush is FlushPolicy.ASYNC_FLUSH
    assert (config.file_reserved_hours, config.delete_when_hour) == (72.0, 4)
    assert config.disk_max_used_percent == 75
    assert config.message_bytes_max == 4194304
    assert config.default_topic_queues == 8
    assert config.auto_create_topic and config.auto_create_subscription_group
    assert config.preferred_leader is None and config.log_level == "INFO"


def test_node_config_and_store_layout() -> None:
    """The log lives in <store>/dledger (LogStore's own subdirectory of node_config's store_dir);
    the broker's derived files sit beside it."""
    config = config_from_argv(
        [
            *REQUIRED,
            "--flush",
            "SYNC_FLUSH",
            "--segment-bytes",
            "65536",
            "--max-message-bytes",
            "1024",
        ]
    )
    node = config.node_config()
    root = Path("/tmp/s/n0")
    assert node.store_dir == root
    assert config.log_dir == root / "dledger"
    assert config.consume_queue_dir == root / "consumequeue"
    assert config.index_dir == root / "index"
    assert config.state_dir == root / "config"
    assert (node.group, node.self_id, node.peers) == ("broker-a", "n0", config.peers)
    assert node.store.flush is FlushPolicy.SYNC_FLUSH and node.store.segment_bytes == 65536
    assert node.store.cache_tail_bytes == 1 << 30  # the default reaches the log
    assert node.disk_max_used_ratio == 0.75 and node.delete_when_hour == 4
    assert node.raft.heartbeat_ticks == 5 and node.raft.election_ticks_min == 50
    assert config.store_host == Address("127.0.0.1", 10911)


class TestPrintConfig:
    def test_prints_key_value_lines_and_exits_0(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exit_info:
            parse_or_exit([*REQUIRED, "-m", "--namesrv", "127.0.0.1:9876"])
        assert exit_info.value.code == 0
        lines = capsys.readouterr().out.splitlines()
        assert "brokerName=broker-a" in lines
        assert f"dLegerPeers={PEERS}" in lines
        assert "namesrvAddr=127.0.0.1:9876" in lines
        assert "flushDiskType=ASYNC_FLUSH" in lines
        assert "deleteWhen=04" in lines
        assert "autoCreateTopicEnable=true" in lines
        assert "maxMessageSize=4194304" in lines
        assert all("=" in line for line in lines)

    def test_output_reads_back_as_the_same_config(self, tmp_path: Path) -> None:
        config = config_from_argv(["-c", str(write(tmp_path, EVERY_KEY))])
        again = config_from_argv(["-c", str(write(tmp_path, bc.format_properties(config)))])
        assert again == config

    def test_incomplete_config_is_not_printed(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert "storePathRootDir" in fails(["-m", *REQUIRED[:6]], capsys)


# Each fault: a file or flags, and what the one line must name.
BAD_FILES = {
    "unknown key": ("storePathRootDir=/s\nbrokerPermission=6\n", ["broker.properties:2", "brokerPermission"]),
    "non-integer": ("maxMessageSize=4MB\n", ["broker.properties:1", "maxMessageSize", "'4MB'"]),
    "bad bool": ("autoCreateTopicEnable=yes\n", ["autoCreateTopicEnable", "'yes'"]),
    "bad flush type": ("flushDiskType=SYNC\n", ["flushDiskType", "'SYNC'"]),
    "port out of range": ("listenPort=70000\n", ["listenPort", "70000"]),
    "message over the entry limit": ("maxMessageSize=4194305\n", ["maxMessageSize"]),
    "queue count 0": ("defaultTopicQueueNums=0\n", ["defaultTopicQueueNums"]),
    "queue count over": ("defaultTopicQueueNums=1025\n", ["defaultTopicQueueNums"]),
    "several delete hours": ("deleteWhen=04;16\n", ["deleteWhen", "04;16"]),
    "delete hour 24": ("deleteWhen=24\n", ["deleteWhen"]),
    "disk ratio over 100": ("diskMaxUsedSpaceRatio=101\n", ["diskMaxUsedSpaceRatio"]),
    "negative hours": ("fileReservedTime=-1\n", ["fileReservedTime"]),
    "bad namesrv": ("namesrvAddr=127.0.0.1\n", ["namesrvAddr"]),
    "namesrv expiry": ("registerNameServerPeriod=30000\n", ["registerNameServerPeriod"]),
    "bad log level": ("logLevel=LOUD\n", ["logLevel"]),
    "group names differ": ("dLegerGroup=other\n", ["dLegerGroup", "brokerName", "broker.properties:2"]),
    "duplicate key": ("brokerClusterName=a\nbrokerClusterName=b\n", ["brokerClusterName", ":2", ":1"]),
    "backslash": ("storePathRootDir=C:\\\\data\n", ["storePathRootDir"]),
    "not DLedger": ("enableDLegerCommitLog=false\n", ["enableDLegerCommitLog"]),
}  # fmt: skip


@pytest.mark.parametrize("fault", sorted(BAD_FILES))
def test_bad_file_exits_2_naming_key_and_line(
    fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body, names = BAD_FILES[fault]
    # the fault first, so that its line number is known; the group after it, the rest as flags
    path = write(tmp_path, body + "brokerName=broker-a\n")
    line = fails(["-c", str(path), *REQUIRED[2:]], capsys)
    for name in names:
        assert name in line, line


BAD_FLAGS = {
    "self-id not in peers": (["--self-id", "n7"], ["dLegerSelfId", "'n7'"]),
    "listen port out of range": (["--listen", "127.0.0.1:0"], ["--listen", "port"]),
    "listen without port": (["--listen", "127.0.0.1"], ["--listen"]),
    "listen on the raft port": (["--listen", "127.0.0.1:40911"], ["listenPort", "Raft"]),
    "tick not an integer": (["--tick-ms", "ten"], ["--tick-ms", "'ten'"]),
    "heartbeat not a multiple of the tick": (["--heartbeat-ms", "55"], ["heartbeatMs", "55 ms"]),
    "preferred leader not a peer": (["--preferred-leader", "n9"], ["preferredLeaderId", "'n9'"]),
    "message larger than a segment": (["--segment-bytes", "65536"], ["maxMessageSize", "65536"]),
    "unspecified broker ip": (["--listen", "0.0.0.0:10911"], ["brokerIP1", "--broker-ip"]),
    "host name as broker ip": (["--listen", "localhost:10911"], ["brokerIP1", "'localhost'"]),
    "bad peers": (["--peers", "n0:127.0.0.1"], ["dLegerPeers"]),
    "segment too small": (["--segment-bytes", "100"], ["mappedFileSizeCommitLog"]),
    "negative cache tail": (["--cache-tail-bytes", "-1"], ["cacheTailBytes", "-1"]),
    "bad group name": (["--group", "a/b"], ["brokerName"]),
    "unknown flag": (["--brokerName", "x"], ["--brokerName"]),
    "missing file": (["-c", "/nonexistent/broker.properties"], ["/nonexistent/broker.properties"]),
}  # fmt: skip


@pytest.mark.parametrize("fault", sorted(BAD_FLAGS))
def test_bad_flag_exits_2_with_one_line(fault: str, capsys: pytest.CaptureFixture[str]) -> None:
    extra, names = BAD_FLAGS[fault]
    line = fails([*REQUIRED, *extra], capsys)
    for name in names:
        assert name in line, line


@pytest.mark.parametrize(
    ("flag", "key"),
    [("--group", "brokerName"), ("--self-id", "dLegerSelfId"), ("--peers", "dLegerPeers"),
     ("--store", "storePathRootDir")],
)  # fmt: skip
def test_missing_required_setting(flag: str, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    at = REQUIRED.index(flag)
    line = fails(REQUIRED[:at] + REQUIRED[at + 2 :], capsys)
    assert key in line and flag in line, line


def test_broker_ip_for_a_wildcard_listen() -> None:
    config = config_from_argv([*REQUIRED, "--listen", "0.0.0.0:10911", "--broker-ip", "10.1.2.3"])
    assert config.listen.host == "0.0.0.0" and config.store_host == Address("10.1.2.3", 10911)


def test_direct_construction_is_validated() -> None:
    """BrokerConfig checks itself, whoever builds it."""
    peers = {"n0": Address("127.0.0.1", 40911)}
    with pytest.raises(ConfigError, match="dLegerSelfId"):
        BrokerConfig(group="g", self_id="n1", peers=peers, store_root=Path("s"))
    assert BrokerConfig(group="g", self_id="n0", peers=peers, store_root=Path("s")).cluster


def test_docs_list_every_key_and_flag() -> None:
    """docs/broker-config.md has a row for every key, with its flag."""
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `")]
    for key in bc.KEYS:
        row = next((r for r in rows if r.startswith(f"| `{key.name}`")), None)
        assert row is not None, key.name
        if key.flag is not None:
            assert f"`{key.flag}" in row, row
    for name in bc.IGNORED_KEYS:
        assert f"`{name}`" in DOCS.read_text(), name


@pytest.mark.parametrize(
    ("change", "key"),
    [({"default_topic_queues": 0}, "defaultTopicQueueNums"), ({"log_level": "debug"}, "logLevel"),
     ({"message_bytes_max": 5 << 20}, "maxMessageSize"), ({"delete_when_hour": 24}, "deleteWhen"),
     ({"file_reserved_hours": -1.0}, "fileReservedTime")],
)  # fmt: skip
def test_direct_construction_checks_each_range(change: dict[str, object], key: str) -> None:
    """A value out of its key's range is refused however the config is built."""
    peers = {"n0": Address("127.0.0.1", 40911)}
    with pytest.raises(ConfigError, match=key):
        BrokerConfig(group="g", self_id="n0", peers=peers, store_root=Path("s"), **change)


def test_unicode_digits_are_not_an_hour(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "deleteWhen=\u00b2\n")
    assert "deleteWhen" in fails(["-c", str(path), *REQUIRED], capsys)
