"""One `dledger-broker` replica's configuration: flags and/or `-c broker.properties` with
RocketMQ's keys; a flag wins over the file (docs/broker-config.md).

    dledger-broker --group broker-a --self-id n0 \\
        --peers "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913" \\
        --listen 127.0.0.1:10911 --namesrv "127.0.0.1:9876;127.0.0.1:9877" --store ./data/broker-a/n0

Pure but for reading the properties file. Every setting is one row of `KEYS` (its key, its flag,
how its text is read and printed), so the parser, the file, `-m` and the docs agree. Anything
an operator can get wrong stops start-up with one line naming the key, and where it came from
(`--flag`, or `file:line`), and exit status 2; `parse_or_exit` does that for `main()`.
The table, its readers and the command line stay in one module (past 400 lines) because they
are read together; the .properties syntax is broker/properties_file.py.

Store layout: `--store` (storePathRootDir) is the replica's store root, as in RocketMQ.

    <store>/dledger/          the replicated log (dledger/log/layout.py): node_config().store_dir
                              is the store root itself, so the audit finds <store>/dledger/meta
    <store>/consumequeue/     ConsumeQueue files (broker/consume_queue.py), derived from the log
    <store>/index/            IndexFiles (broker/index_file.py), derived from the log
    <store>/config/           the broker's own state (metadata checkpoint), RocketMQ's name
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import attrs

from broker import limits as broker_limits
from broker.consume_queue import CONSUME_QUEUE_DIR
from broker.delays import (
    DEFAULT_LEVELS_TEXT,
    TIMER_MAX_DELAY_SEC_DEFAULT,
    format_levels,
    parse_levels,
)
from broker.index_file import INDEX_DIR
from broker.properties_file import Property, read_properties
from broker.state import Geometry
from dledger import limits as dledger_limits
from dledger.config import (
    GROUP,
    Address,
    ConfigError,
    NodeConfig,
    format_peers,
    parse_peers,
    raft_config_from_ms,
)
from dledger.log.layout import STORE_DIR
from dledger.log.store import FlushPolicy, StoreConfig
from namesrv import limits as namesrv_limits
from remoting import limits as remoting_limits

log = logging.getLogger("broker.config")

PROG = "dledger-broker"
STATE_DIR = "config"  # RocketMQ keeps topics.json, consumerOffset.json, ... in <root>/config

LISTEN_PORT_DEFAULT = 10911  # RocketMQ's listenPort default
BIND_HOST_DEFAULT = "127.0.0.1"  # tests bind only 127.0.0.0/8; serving others takes --listen
LISTEN_DEFAULT = Address(BIND_HOST_DEFAULT, LISTEN_PORT_DEFAULT)
DEFAULT_TOPIC_QUEUES_MAX = 1024  # each queue is a directory of files and a row in every route
# The namesrv forgets a broker it has not heard from for this long (by default 10 s, not
# RocketMQ's 120 s), so a broker re-registers at least 3 times per expiry: two lost
# registrations in a row do not drop its routes.
NAMESRV_BROKER_EXPIRY_MS = round(namesrv_limits.BROKER_EXPIRY_S_DEFAULT * 1000)
NAMESRV_HEARTBEAT_MS_DEFAULT = 3000
NAMESRV_HEARTBEAT_MS_MIN = 100  # each registration carries every topic config to every namesrv
NAMESRV_HEARTBEAT_MS_MAX = NAMESRV_BROKER_EXPIRY_MS // 3
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
TIMER_MAX_DELAY_SEC_MAX = 365 * 86_400  # a timer message is rolled forward, so any is kept
TRANSACTION_MS_MAX = 86_400_000  # a half waits for its checks at most about a day per step
TRANSACTION_CHECK_MAX_MAX = 1000
RAFT_TIMING = "tickMs, heartbeatMs, electionTimeoutMs, electionTimeoutMaxMs"
# 32 mapped segments (dledger's SEGMENTS_OPEN_MAX) then take at most 128 GiB of address space
SEGMENT_BYTES_MAX = 4 << 30
CACHE_TAIL_BYTES_MAX = 1 << 50  # above any log: never let go of anything

# maxMessageSize bounds the whole stored record, as RocketMQ's CommitLog checks it; it can be
# lowered, never raised past what one log entry holds (asserted in broker/limits.py).
assert dledger_limits.SEGMENT_BYTES_DEFAULT <= SEGMENT_BYTES_MAX
assert NAMESRV_HEARTBEAT_MS_MIN <= NAMESRV_HEARTBEAT_MS_DEFAULT <= NAMESRV_HEARTBEAT_MS_MAX

# RocketMQ keys that users' files commonly carry and that mean nothing on DLedger: accepted, with
# a warning that they are ignored. Any other key we do not act on is refused as unknown, so a
# setting the operator relies on is never silently dropped.
IGNORED_KEYS = {
    "brokerId": "on DLedger the Raft role decides it (the leader registers as 0)",
    "brokerRole": "on DLedger the Raft role decides it (leader = master, followers = slaves)",
    "brokerIP2": "it is the master-slave HA address; Raft replicates over dLegerPeers",
    "enableDLegerCommitLog": "this broker always stores its commitlog on DLedger",
    "storePathCommitLog": "the log lives in <storePathRootDir>/dledger",
    "sendMessageThreadPoolNums": "requests run on trio tasks, not thread pools",
    "pullMessageThreadPoolNums": "requests run on trio tasks, not thread pools",
}


@attrs.frozen
class BrokerConfig:
    """Everything one replica needs; validated when built, messages name RocketMQ's keys."""

    group: str  # brokerName = dLegerGroup: the broker group is the Raft group
    self_id: str  # dLegerSelfId
    peers: dict[str, Address]  # dLegerPeers: the Raft peers' addresses, this replica's included
    store_root: Path  # storePathRootDir
    cluster: str = "DefaultCluster"  # brokerClusterName
    listen: Address = LISTEN_DEFAULT  # clients connect here
    # brokerIP1: the address clients are told and message ids carry (default: the bind host)
    broker_ip: str = attrs.field(
        default=attrs.Factory(lambda self: self.listen.host, takes_self=True)
    )
    namesrv: tuple[Address, ...] = ()  # namesrvAddr; empty: register nowhere
    namesrv_heartbeat_ms: int = NAMESRV_HEARTBEAT_MS_DEFAULT  # registerNameServerPeriod
    flush: FlushPolicy = FlushPolicy.ASYNC_FLUSH  # flushDiskType, RocketMQ's default
    file_reserved_hours: float = 72.0  # fileReservedTime
    delete_when_hour: int = 4  # deleteWhen "04"
    disk_max_used_percent: int = 75  # diskMaxUsedSpaceRatio
    message_bytes_max: int = remoting_limits.STORED_MESSAGE_BYTES_MAX  # maxMessageSize
    default_topic_queues: int = 8  # defaultTopicQueueNums, RocketMQ 4.9's default
    auto_create_topic: bool = True  # autoCreateTopicEnable
    auto_create_subscription_group: bool = True  # autoCreateSubscriptionGroup
    enable_property_filter: bool = True  # enablePropertyFilter: SQL92 subscriptions
    delay_levels: tuple[int, ...] = parse_levels(DEFAULT_LEVELS_TEXT)  # messageDelayLevel, ms
    timer_max_delay_s: int = TIMER_MAX_DELAY_SEC_DEFAULT  # timerMaxDelaySec
    # transactions: the first check of an unresolved half after this, then every interval,
    # at most `transaction_check_max` times, then it is discarded (broker/transaction_check.py)
    transaction_timeout_ms: int = 6000  # transactionTimeOut
    transaction_check_interval_ms: int = 60_000  # transactionCheckInterval
    transaction_check_max: int = 15  # transactionCheckMax
    segment_bytes: int = dledger_limits.SEGMENT_BYTES_DEFAULT  # mappedFileSizeCommitLog
    cache_tail_bytes: int = dledger_limits.CACHE_TAIL_BYTES_DEFAULT
    preferred_leader: str | None = None  # preferredLeaderId
    tick_ms: int = dledger_limits.TICK_MS_DEFAULT
    heartbeat_ms: int = dledger_limits.HEARTBEAT_TICKS_DEFAULT * dledger_limits.TICK_MS_DEFAULT
    election_timeout_ms_min: int = (
        dledger_limits.ELECTION_TICKS_MIN_DEFAULT * dledger_limits.TICK_MS_DEFAULT
    )
    election_timeout_ms_max: int = (
        dledger_limits.ELECTION_TICKS_MAX_DEFAULT * dledger_limits.TICK_MS_DEFAULT
    )
    log_level: str = "INFO"
    # the derived files' geometry (RocketMQ's defaults; tests run with small ones)
    consume_queue_file_bytes: int = (
        broker_limits.CQ_UNITS_PER_FILE_DEFAULT * broker_limits.CQ_UNIT_BYTES
    )
    index_slots: int = broker_limits.INDEX_SLOTS_DEFAULT  # maxHashSlotNum
    index_items: int = broker_limits.INDEX_ITEMS_DEFAULT  # maxIndexNum

    def geometry(self) -> Geometry:
        return Geometry(
            cq_units_per_file=self.consume_queue_file_bytes // broker_limits.CQ_UNIT_BYTES,
            index_slots=self.index_slots,
            index_items=self.index_items,
        )

    def __attrs_post_init__(self) -> None:
        for key in KEYS:  # each value within its key's range, and -m prints what reads back
            value = field_value(self, key.field)
            try:
                same = key.read(key.format(value)) == value
            except ValueError as err:
                raise ConfigError(f"{key.name}: {err}") from None
            if not same:
                raise ConfigError(f"{key.name}: {value!r} does not read back from its text")
        if not GROUP.match(self.group):
            raise ConfigError(
                f"brokerName {self.group!r} must be 1-128 letters, digits, '_', '.', '-'"
            )
        if not self.cluster:
            raise ConfigError("brokerClusterName is empty")
        if self.self_id not in self.peers:
            known = ", ".join(self.peers) or "none"
            raise ConfigError(f"dLegerSelfId {self.self_id!r} is not in dLegerPeers ({known})")
        raft_address = self.peers[self.self_id]
        if raft_address == self.listen:
            raise ConfigError(
                f"listenPort: {self.listen} is also this replica's Raft address in dLegerPeers"
            )
        check_broker_ip(self.broker_ip)
        if self.preferred_leader is not None and self.preferred_leader not in self.peers:
            raise ConfigError(f"preferredLeaderId {self.preferred_leader!r} is not in dLegerPeers")
        entry_bytes_max = dledger_limits.ENTRY_HEADER_BYTES + self.message_bytes_max
        if entry_bytes_max > self.segment_bytes:  # no entry spans two segments
            raise ConfigError(
                f"maxMessageSize ({self.message_bytes_max}) plus the log entry header "
                f"({dledger_limits.ENTRY_HEADER_BYTES}) must fit one segment "
                f"(mappedFileSizeCommitLog {self.segment_bytes})"
            )
        if len(set(self.namesrv)) != len(self.namesrv):
            raise ConfigError("namesrvAddr names a name server twice")
        try:
            self.node_config()
        except ConfigError as err:
            raise ConfigError(f"{RAFT_TIMING}: {err}") from err

    @property
    def log_dir(self) -> Path:
        """The replicated log's own directory (what dledger's LogStore writes)."""
        return self.store_root / STORE_DIR

    @property
    def consume_queue_dir(self) -> Path:
        return self.store_root / CONSUME_QUEUE_DIR

    @property
    def index_dir(self) -> Path:
        return self.store_root / INDEX_DIR

    @property
    def state_dir(self) -> Path:
        """The broker's own files: the metadata checkpoint (RocketMQ's <root>/config)."""
        return self.store_root / STATE_DIR

    @property
    def store_host(self) -> Address:
        """What stored messages and message ids carry: brokerIP1 and the client port."""
        return Address(self.broker_ip, self.listen.port)

    def node_config(self) -> NodeConfig:
        """The embedded dledger node's configuration. Its store_dir is the store root: the log
        then lives in <store root>/dledger/, beside the broker's derived files."""
        raft = raft_config_from_ms(
            self.tick_ms,
            self.heartbeat_ms,
            self.election_timeout_ms_min,
            self.election_timeout_ms_max,
            self.preferred_leader,
        )
        try:
            store = StoreConfig(
                segment_bytes=self.segment_bytes,
                flush=self.flush,
                cache_tail_bytes=self.cache_tail_bytes,
            )
        except ValueError as err:
            raise ConfigError(str(err)) from err
        return NodeConfig(
            group=self.group,
            self_id=self.self_id,
            peers=self.peers,
            store_dir=self.store_root,
            tick_ms=self.tick_ms,
            raft=raft,
            store=store,
            file_reserved_hours=self.file_reserved_hours,
            delete_when_hour=self.delete_when_hour,
            disk_max_used_ratio=self.disk_max_used_percent / 100,
        )


def field_value(config: BrokerConfig, field: str) -> Any:
    """A field by its KEYS name: "cluster", or "listen.port" for a part of one."""
    value: Any = config
    for part in field.split("."):
        value = getattr(value, part)
    return value


def check_broker_ip(text: str) -> None:
    """brokerIP1 goes into every stored message and message id: an IP clients can reach."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise ConfigError(
            f"brokerIP1 {text!r} is not an IP address (message ids carry it); set --broker-ip"
        ) from None
    if ip.is_unspecified:
        raise ConfigError(f"brokerIP1 {text} is no address clients can reach; set --broker-ip")


# --- reading one value -----------------------------------------------------------------------
# Each reader takes the text of a flag or a file value and returns the field's value, or raises
# ValueError with the reason (the caller adds the key and where the text came from).

INTEGER = re.compile(r"^-?[0-9]+$")
DECIMAL = re.compile(r"^[0-9]+(\.[0-9]+)?$")
HOUR = re.compile(r"^[0-9]{1,2}$")


def read_int(low: int, high: int) -> Callable[[str], int]:
    def read(text: str) -> int:
        if not INTEGER.match(text):
            raise ValueError(f"{text!r} is not an integer")
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"{value} is not in {low}..{high}")
        return value

    return read


def read_cq_file_bytes(text: str) -> int:
    value = read_int(broker_limits.CQ_UNIT_BYTES, 1 << 30)(text)
    if value % broker_limits.CQ_UNIT_BYTES:
        raise ValueError(f"{value} is not a multiple of {broker_limits.CQ_UNIT_BYTES}")
    return value


def read_bool(text: str) -> bool:
    """True or false, in any case. Java's parseBoolean reads any other word as false, so a
    typo would silently flip the setting; we refuse it."""
    if text.lower() == "true":
        return True
    if text.lower() == "false":
        return False
    raise ValueError(f"{text!r} is not true or false")


def read_name(text: str) -> str:
    if not text:
        raise ValueError("it is empty")
    return text


def read_hours(text: str) -> float:
    """fileReservedTime: whole hours as RocketMQ, or a decimal such as 0.5 (for trials)."""
    if not DECIMAL.match(text):
        raise ValueError(f"{text!r} is not a number of hours")
    return float(text)


def read_delete_when(text: str) -> int:
    """deleteWhen: the hour of the day (0-23, "04") expired segments are deleted. RocketMQ
    also takes several, "04;16"; dledger's retention runs at one hour, so we take one."""
    hours = [part.strip() for part in text.split(";") if part.strip()]
    if len(hours) > 1:
        raise ValueError(f"{text!r} names {len(hours)} hours; this broker deletes at one, e.g. 04")
    if len(hours) != 1 or not HOUR.match(hours[0]) or not 0 <= int(hours[0]) <= 23:
        raise ValueError(f"{text!r} is not an hour 00-23")
    return int(hours[0])


def format_hour(hour: int) -> str:
    return f"{hour:02d}"


def read_flush(text: str) -> FlushPolicy:
    try:
        return FlushPolicy(text)
    except ValueError:
        raise ValueError(f"{text!r} is not SYNC_FLUSH or ASYNC_FLUSH") from None


def read_peers(text: str) -> dict[str, Address]:
    try:
        return parse_peers(text)
    except ConfigError as err:
        raise ValueError(str(err)) from None


def read_namesrv(text: str) -> tuple[Address, ...]:
    """namesrvAddr: "host:port;host:port"; empty means no name server."""
    try:
        return tuple(Address.parse(part) for part in text.split(";") if part.strip())
    except ConfigError as err:
        raise ValueError(str(err)) from None


def read_port(text: str) -> int:
    return read_int(1, 65535)(text)


def read_path(text: str) -> Path:
    return Path(read_name(text))


def read_optional_name(text: str) -> str | None:
    return text or None


def read_log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise ValueError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def read_ms(text: str) -> int:
    return read_int(1, 3_600_000)(text)


def read_levels(text: str) -> tuple[int, ...]:
    """messageDelayLevel: "1s 5s 10s ... 2h", RocketMQ's units s, m, h, d (and ms, ours)."""
    return parse_levels(text)


def format_delay_levels(value: Any) -> str:
    return format_levels(tuple(value))


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, FlushPolicy):
        return value.value
    if isinstance(value, dict):
        return format_peers(value)
    if isinstance(value, tuple):
        return ";".join(str(address) for address in value)
    if value is None:
        return ""
    return str(value)


@attrs.frozen
class Key:
    """One setting: its key in broker.properties (RocketMQ's name, or ours where RocketMQ has
    none), its flag, the BrokerConfig field it sets, how its text is read, and a line of help."""

    name: str
    flag: str | None
    field: str
    read: Callable[[str], Any]
    help: str
    rocketmq: bool = True  # False: a key of ours
    format: Callable[[Any], str] = format_value


KEYS: tuple[Key, ...] = (
    Key("brokerClusterName", "--cluster", "cluster", read_name, "cluster this group belongs to"),
    Key("brokerName", "--group", "group", read_name, "broker group = Raft group"),
    Key("dLegerGroup", None, "group", read_name, "the same as brokerName; if both, equal"),
    Key("dLegerSelfId", "--self-id", "self_id", read_name, "this replica, one of the peers"),
    Key("dLegerPeers", "--peers", "peers", read_peers, '"n0-host:port;n1-host:port;..." Raft'),
    Key("preferredLeaderId", "--preferred-leader", "preferred_leader", read_optional_name,
        "hand leadership to this peer whenever it is healthy"),
    Key("bindAddress", None, "listen.host", read_name,
        "host the client port binds (--listen's host)", rocketmq=False),
    Key("listenPort", None, "listen.port", read_port, "client port (--listen's port)"),
    Key("brokerIP1", "--broker-ip", "broker_ip", read_name,
        "address clients are told and message ids carry"),
    Key("namesrvAddr", "--namesrv", "namesrv", read_namesrv,
        '"host:port;host:port"; empty: register nowhere'),
    Key("registerNameServerPeriod", "--namesrv-heartbeat-ms", "namesrv_heartbeat_ms",
        read_int(NAMESRV_HEARTBEAT_MS_MIN, NAMESRV_HEARTBEAT_MS_MAX),
        "re-register with every name server this often (ms)"),
    Key("storePathRootDir", "--store", "store_root", read_path, "the replica's store root"),
    Key("flushDiskType", "--flush", "flush", read_flush, "SYNC_FLUSH or ASYNC_FLUSH"),
    Key("fileReservedTime", "--file-reserved-hours", "file_reserved_hours", read_hours,
        "keep log segments this many hours"),
    Key("deleteWhen", "--delete-when", "delete_when_hour", read_delete_when,
        "hour of day expired segments are deleted", format=format_hour),
    Key("diskMaxUsedSpaceRatio", "--disk-max-used-percent", "disk_max_used_percent",
        read_int(1, 100), "delete old segments at once past this disk use (%)"),
    Key("maxMessageSize", "--max-message-bytes", "message_bytes_max",
        read_int(1, remoting_limits.STORED_MESSAGE_BYTES_MAX), "largest stored message (bytes)"),
    Key("defaultTopicQueueNums", "--default-topic-queues", "default_topic_queues",
        read_int(1, DEFAULT_TOPIC_QUEUES_MAX), "queues of an auto-created topic"),
    Key("autoCreateTopicEnable", "--auto-create-topic", "auto_create_topic", read_bool,
        "create a topic on first send"),
    Key("autoCreateSubscriptionGroup", "--auto-create-subscription-group",
        "auto_create_subscription_group", read_bool, "create a group on first use"),
    Key("enablePropertyFilter", "--enable-property-filter", "enable_property_filter", read_bool,
        "accept SQL92 subscriptions (filters on message properties)"),
    Key("messageDelayLevel", "--message-delay-level", "delay_levels", read_levels,
        "delays of levels 1, 2, ...: \"1s 5s 10s ... 2h\"", format=format_delay_levels),
    Key("timerMaxDelaySec", "--timer-max-delay-sec", "timer_max_delay_s",
        read_int(1, TIMER_MAX_DELAY_SEC_MAX), "the furthest a timer message may be due (s)"),
    Key("transactionTimeOut", "--transaction-timeout-ms", "transaction_timeout_ms",
        read_int(1, TRANSACTION_MS_MAX),
        "check an unresolved half message back with its producer after this (ms)"),
    Key("transactionCheckInterval", "--transaction-check-interval-ms",
        "transaction_check_interval_ms", read_int(1, TRANSACTION_MS_MAX),
        "then check it again this often (ms)"),
    Key("transactionCheckMax", "--transaction-check-max", "transaction_check_max",
        read_int(0, TRANSACTION_CHECK_MAX_MAX),
        "checks of a half message before it is discarded"),
    Key("mappedFileSizeCommitLog", "--segment-bytes", "segment_bytes",
        read_int(dledger_limits.SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX),
        "log segment size; the same on every replica"),
    Key("cacheTailBytes", "--cache-tail-bytes", "cache_tail_bytes",
        read_int(0, CACHE_TAIL_BYTES_MAX),
        "keep this much of the log's newest bytes in the page cache, let go of older pages "
        "after each flush (0: leave it to the kernel)", rocketmq=False),
    Key("mappedFileSizeConsumeQueue", "--cq-file-bytes", "consume_queue_file_bytes",
        read_cq_file_bytes, "ConsumeQueue file size (bytes, a multiple of 20)"),
    Key("maxHashSlotNum", "--index-slots", "index_slots", read_int(1, 50_000_000),
        "hash slots per IndexFile"),
    Key("maxIndexNum", "--index-items", "index_items", read_int(2, 200_000_000),
        "index items per IndexFile"),
    Key("tickMs", "--tick-ms", "tick_ms", read_ms, "Raft tick", rocketmq=False),
    Key("heartbeatMs", "--heartbeat-ms", "heartbeat_ms", read_ms, "Raft heartbeat",
        rocketmq=False),
    Key("electionTimeoutMs", "--election-timeout-ms", "election_timeout_ms_min", read_ms,
        "shortest election timeout", rocketmq=False),
    Key("electionTimeoutMaxMs", "--election-timeout-max-ms", "election_timeout_ms_max", read_ms,
        "longest election timeout", rocketmq=False),
    Key("logLevel", "--log-level", "log_level", read_log_level, "DEBUG, INFO, WARNING, ERROR",
        rocketmq=False),
)  # fmt: skip
KEYS_BY_NAME = {key.name: key for key in KEYS}
REQUIRED = {"group": "brokerName", "self_id": "dLegerSelfId", "peers": "dLegerPeers",
            "store_root": "storePathRootDir"}  # fmt: skip
FLAG_OF_FIELD = {key.field: key.flag for key in KEYS if key.flag is not None}
FLAG_OF_FIELD["listen.host"] = FLAG_OF_FIELD["listen.port"] = "--listen"


# --- the command line ------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage, so every error is one line."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="One replica of a RocketMQ broker group on DLedger. Flags win over -c FILE.",
        epilog="Keys and defaults: docs/broker-config.md",
    )
    p.add_argument("-c", "--config-file", type=Path, help="broker.properties with RocketMQ's keys")
    p.add_argument(
        "-m",
        "--print-config",
        action="store_true",
        help="print the effective configuration as key=value lines and exit",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"where clients connect (bindAddress, listenPort; default {LISTEN_DEFAULT})",
    )
    defaults = {field.name: field.default for field in attrs.fields(BrokerConfig)}
    for key in KEYS:
        if key.flag is None:
            continue
        flags = [key.flag, "-n"] if key.flag == "--namesrv" else [key.flag]
        dest = key.field
        default = defaults.get(key.field)
        if key.field in REQUIRED:
            shown = "; required"
        elif default in (None, attrs.NOTHING, ()) or hasattr(default, "factory"):
            shown = ""  # none, or derived from another setting
        else:
            shown = f"; default {key.format(default)}"
        help = f"{key.help} ({key.name}{shown})".replace("%", "%%")  # argparse %-formats help
        if key.read is read_bool:
            p.add_argument(*flags, dest=dest, action=argparse.BooleanOptionalAction, help=help)
        else:
            metavar = key.flag.lstrip("-").replace("-", "_").upper()
            p.add_argument(*flags, dest=dest, metavar=metavar, help=help)
    return p


def config_from_argv(argv: Sequence[str] | None) -> BrokerConfig:
    """The configuration the command line (and its -c file) gives; ConfigError for any fault."""
    return _parse(argv)[0]


def _parse(argv: Sequence[str] | None) -> tuple[BrokerConfig, bool]:
    args = build_parser().parse_args(argv)
    file = read_properties(args.config_file) if args.config_file is not None else {}
    texts = _merge(args, file)
    values: dict[str, Any] = {}
    for field, (key, text, origin) in texts.items():
        try:
            values[field] = key.read(text)
        except ValueError as err:
            raise ConfigError(f"{origin}: {key.name}: {err}") from None
    for field, name in REQUIRED.items():
        if field not in values:
            raise ConfigError(f"{name} is not set ({FLAG_OF_FIELD[field]}, or {name} in -c FILE)")
    host = values.pop("listen.host", BIND_HOST_DEFAULT)
    port = values.pop("listen.port", LISTEN_PORT_DEFAULT)
    values["listen"] = Address(host, port)
    return BrokerConfig(**values), bool(args.print_config)


def _merge(args: argparse.Namespace, file: dict[str, Property]) -> dict[str, tuple[Key, str, str]]:
    """For each field that is set: its key, its text and where the text came from."""
    for name, prop in file.items():
        if name in IGNORED_KEYS:
            if name == "enableDLegerCommitLog" and prop.value.lower() == "false":
                raise ConfigError(
                    f"{prop.origin}: enableDLegerCommitLog=false: this broker only runs on DLedger"
                )
            log.warning("%s: ignoring %s: %s", prop.origin, name, IGNORED_KEYS[name])
        elif name not in KEYS_BY_NAME:
            raise ConfigError(f"{prop.origin}: unknown key {name!r}")
    texts: dict[str, tuple[Key, str, str]] = {}
    for key in KEYS:
        if key.name in file:
            prop = file[key.name]
            earlier = texts.get(key.field)
            if earlier is not None and earlier[1] != prop.value:  # dLegerGroup vs brokerName
                raise ConfigError(
                    f"{prop.origin}: {key.name} {prop.value!r} differs from "
                    f"{earlier[0].name} {earlier[1]!r} at {earlier[2]}"
                )
            texts[key.field] = (key, prop.value, prop.origin)
    if args.listen is not None:
        try:
            listen = Address.parse(args.listen)
        except ConfigError as err:
            raise ConfigError(f"--listen: {err}") from None
        texts["listen.host"] = (KEYS_BY_NAME["bindAddress"], listen.host, "--listen")
        texts["listen.port"] = (KEYS_BY_NAME["listenPort"], str(listen.port), "--listen")
    for key in KEYS:
        flag_value = getattr(args, key.field, None) if key.flag is not None else None
        if flag_value is not None:
            text = format_value(flag_value) if isinstance(flag_value, bool) else flag_value
            texts[key.field] = (key, text, key.flag or key.name)
    return texts


def format_properties(config: BrokerConfig) -> str:
    """The effective configuration, one `key=value` line per key, as RocketMQ's `-m` prints it;
    the output is itself a valid -c file."""
    lines = []
    for key in KEYS:
        if key.name == "dLegerGroup":
            continue  # the same as brokerName
        lines.append(f"{key.name}={key.format(field_value(config, key.field))}")
    return "\n".join(lines) + "\n"


def parse_or_exit(argv: Sequence[str] | None = None) -> BrokerConfig:
    """For main(): the configuration, or one line `dledger-broker: <reason>` on stderr and exit
    status 2; with -m, the effective configuration on stdout and exit status 0."""
    try:
        config, print_only = _parse(argv)
    except ConfigError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if print_only:
        sys.stdout.write(format_properties(config))
        raise SystemExit(0)
    return config
