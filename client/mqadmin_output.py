"""What `mqadmin` prints: aligned tables with RocketMQ's `#Column` headers, message detail
blocks as RocketMQ's queryMsgById prints them, and the JSON form of any admin result."""

from __future__ import annotations

import argparse
import enum
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from client.admin_results import (
    BrokerChange,
    BrokerConfig,
    BrokerStatus,
    ClusterMember,
    ConsumeProgress,
    ConsumerConnections,
    FoundMessage,
    LeadershipTransfer,
    OffsetReset,
    QueueProgress,
    QueueStatus,
)
from client.message import MessageExt
from client.route import TopicRoute
from client.send_result import SendResult

COLUMN_GAP = "  "


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns, each as wide as its widest cell, headers marked `#` as RocketMQ
    marks them; the last column is not padded."""
    cells = [[f"#{h}" for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append(COLUMN_GAP.join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def human_time_ms(ms: int) -> str:
    """RocketMQ's UtilAll.timeMillisToHumanString2: local time, "2024-05-01 10:00:00,123";
    "N/A" for 0 (never)."""
    if ms <= 0:
        return "N/A"
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f",{millis:03d}"


def body_text(body: bytes) -> str:
    return body.decode("utf-8", errors="backslashreplace")


def message_block(found: FoundMessage) -> str:
    """One message as RocketMQ's queryMsgById prints it, with the body inline."""
    m = found.message
    rows = [
        ("OffsetID", m.offset_msg_id),
        ("MsgId", m.msg_id),
        ("Topic", m.topic),
        ("Tags", f"[{m.tags or ''}]"),
        ("Keys", f"[{' '.join(m.keys)}]"),
        ("Broker Name", m.queue.broker_name),
        ("Queue ID", m.queue.queue_id),
        ("Queue Offset", m.queue_offset),
        ("CommitLog Offset", m.commit_log_offset),
        ("Reconsume Times", m.reconsume_times),
        ("Born Timestamp", human_time_ms(m.born_timestamp_ms)),
        ("Store Timestamp", human_time_ms(m.store_timestamp_ms)),
        ("Born Host", m.born_host),
        ("Store Host", m.store_host),
        ("System Flag", m.sys_flag),
        ("Properties", "{" + ", ".join(f"{k}={v}" for k, v in m.properties.items()) + "}"),
        ("Message Body", body_text(m.body)),
        ("Answered By", found.address),
    ]
    return "\n".join(f"{label + ':':<26}{value}" for label, value in rows)


def message_line(found: FoundMessage) -> str:
    """One message of printMsg: RocketMQ's `MSGID: <id> <message> BODY: <body>`, shorter."""
    m = found.message
    return (
        f"MSGID: {m.msg_id} QUEUE: {m.queue} OFFSET: {m.queue_offset} "
        f"STORED: {human_time_ms(m.store_timestamp_ms)} TAGS: {m.tags or ''} "
        f"KEYS: {' '.join(m.keys)} BODY: {body_text(m.body)}"
    )


def jsonable(value: Any) -> Any:
    """An admin result as JSON values: attrs classes as objects of their fields (snake_case),
    bytes as UTF-8 text, enums as their values, computed lag fields added where a reader wants them."""
    if isinstance(value, MessageExt):
        out = {f.name: jsonable(getattr(value, f.name)) for f in attrs.fields(MessageExt)}
        out["tags"], out["keys"] = value.tags, value.keys
        return out
    if attrs.has(type(value)):
        out = {f.name: jsonable(getattr(value, f.name)) for f in attrs.fields(type(value))}
        if isinstance(value, QueueProgress):
            out["diff"] = value.diff
        if isinstance(value, ConsumeProgress):
            out["diff_total"] = value.diff_total
        return out
    if isinstance(value, bytes):
        return body_text(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


# --- each command's table ---------------------------------------------------------------------


def show_changes(
    verb: str, what: str, preposition: str = "to"
) -> Callable[[list[BrokerChange], argparse.Namespace], str]:
    """RocketMQ's lines: "create topic to 127.0.0.1:10911 success.", one per broker group."""

    def show(changes: list[BrokerChange], args: argparse.Namespace) -> str:
        return "\n".join(
            f"{verb} {what} {preposition} {c.address} ({c.broker_name or 'broker'}) success."
            for c in changes
        )

    return show


def show_cluster(rows: list[ClusterMember], args: argparse.Namespace) -> str:
    headers = (
        "Cluster Name",
        "Broker Name",
        "BID",
        "Addr",
        "Version",
        "Raft Role",
        "Term",
        "Commit Index",
        "Applied Index",
    )
    body = []
    for r in rows:
        t = r.runtime
        role = t.get("raftRole", t.get("brokerRole", "")) if not r.error else "unreachable"
        body.append(
            (
                r.cluster,
                r.broker_name,
                r.broker_id,
                r.address,
                t.get("brokerVersionDesc", "-"),
                role,
                t.get("raftTerm", ""),
                t.get("commitIndex", ""),
                t.get("appliedIndex", ""),
            )
        )
    return table(headers, body)


def show_route(route: TopicRoute, args: argparse.Namespace) -> str:
    rows = []
    queues = {q.broker_name: q for q in route.queue_datas}
    for b in sorted(route.broker_datas, key=lambda b: b.broker_name):
        q = queues.get(b.broker_name)
        addrs = ",".join(f"{i}={a}" for i, a in sorted(b.broker_addrs.items()))
        rows.append(
            (
                b.cluster,
                b.broker_name,
                addrs,
                q.read_queue_nums if q else 0,
                q.write_queue_nums if q else 0,
                q.perm if q else 0,
            )
        )
    headers = ("Cluster Name", "Broker Name", "Broker Addrs", "Read Queue", "Write Queue", "Perm")
    return table(headers, rows)


def show_status(queues: list[QueueStatus], args: argparse.Namespace) -> str:
    rows = [
        (
            q.queue.broker_name,
            q.queue.queue_id,
            q.min_offset,
            q.max_offset,
            human_time_ms(q.last_update_ms) if q.last_update_ms else "",
        )
        for q in queues
    ]
    return table(("Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"), rows)


def show_delete_topic(changes: list[BrokerChange], args: argparse.Namespace) -> str:
    lines = [
        f"delete topic [{args.topic}] from {c.broker_name} ({c.address}) success." for c in changes
    ]
    lines.append(f"delete topic [{args.topic}] from cluster [{args.cluster}] success.")
    lines.append(f"delete topic [{args.topic}] from NameServer success.")
    return "\n".join(lines)


def show_progress(progress: ConsumeProgress, args: argparse.Namespace) -> str:
    rows = [
        (
            q.queue.topic,
            q.queue.broker_name,
            q.queue.queue_id,
            q.broker_offset,
            q.consumer_offset,
            q.diff,
            human_time_ms(q.last_timestamp_ms),
        )
        for q in progress.queues
    ]
    headers = (
        "Topic",
        "Broker Name",
        "QID",
        "Broker Offset",
        "Consumer Offset",
        "Diff",
        "LastTime",
    )
    return "\n".join(
        [
            table(headers, rows),
            "",
            f"Consume TPS: {progress.consume_tps:.2f}",
            f"Diff Total: {progress.diff_total}",
        ]
    )


def show_connections(c: ConsumerConnections, args: argparse.Namespace) -> str:
    clients = [
        (i, x.client_id, x.client_addr, x.language, x.version) for i, x in enumerate(c.clients, 1)
    ]
    subs = [(i, s.topic, s.expression) for i, s in enumerate(c.subscriptions, 1)]
    return "\n".join(
        [
            table(("", "ClientId", "ClientAddr", "Language", "Version"), clients),
            "",
            "Below is subscription:",
            table(("", "Topic", "SubExpression"), subs),
            "",
            f"ConsumeType: {c.consume_type}",
            f"MessageModel: {c.message_model}",
            f"ConsumeFromWhere: {c.consume_from_where}",
        ]
    )


def show_broker_status(found: list[BrokerStatus], args: argparse.Namespace) -> str:
    lines = []
    for status in found:
        prefix = f"{status.address:<24}" if len(found) > 1 or args.cluster else ""
        lines += [f"{prefix}{key:<32}: {status.table[key]}" for key in sorted(status.table)]
    return "\n".join(lines)


def show_broker_config(found: list[BrokerConfig], args: argparse.Namespace) -> str:
    lines = []
    for config in found:
        lines.append(f"============{config.address}============")
        lines += [f"{key:<50}=  {value}" for key, value in config.properties.items()]
    return "\n".join(lines)


def show_messages(found: list[FoundMessage], args: argparse.Namespace) -> str:
    return "\n\n".join(message_block(f) for f in found)


def show_by_key(found: list[FoundMessage], args: argparse.Namespace) -> str:
    rows = [
        (
            f.message.msg_id,
            f.message.offset_msg_id,
            f.message.queue.broker_name,
            f.message.queue.queue_id,
            f.message.queue_offset,
            human_time_ms(f.message.store_timestamp_ms),
        )
        for f in found
    ]
    headers = ("Message ID", "Offset Msg ID", "Broker Name", "QID", "Offset", "Store Time")
    return table(headers, rows)


def show_sent(sent: SendResult, args: argparse.Namespace) -> str:
    headers = ("Broker Name", "QID", "Queue Offset", "Send Result", "MsgId", "Offset Msg ID")
    row = (
        sent.queue.broker_name,
        sent.queue.queue_id,
        sent.queue_offset,
        sent.status.value,
        sent.msg_id,
        sent.offset_msg_id,
    )
    return table(headers, [row])


def show_print(found: list[FoundMessage], args: argparse.Namespace) -> str:
    lines = [message_line(f) for f in found]
    if len(found) >= args.max:
        lines.append(f"(printed the first {args.max} messages; -m raises the limit)")
    return "\n".join(lines)


def show_reset(rows: list[OffsetReset], args: argparse.Namespace) -> str:
    body = [
        (
            r.queue.broker_name,
            r.queue.queue_id,
            r.old_offset if r.old_offset >= 0 else "",
            r.new_offset,
        )
        for r in rows
    ]
    return table(("brokerName", "queueId", "oldOffset", "offset"), body)


def show_transfer(t: LeadershipTransfer, args: argparse.Namespace) -> str:
    if t.previous_leader == t.leader:
        return f"{t.leader} already leads {t.group} (term {t.term}, master {t.address})"
    return (
        f"leadership of {t.group} moved from {t.previous_leader or 'nobody'} to {t.leader} "
        f"(term {t.term}, master {t.address})"
    )
