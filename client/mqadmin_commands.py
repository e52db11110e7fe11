"""mqadmin's commands: for each, its flags (RocketMQ's letters), the admin call it makes and the
function that prints its result as a table (client/mqadmin_output.py)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from client.admin import PERM_DEFAULT, QUEUES_DEFAULT, Admin
from client.admin_messages import PRINT_COUNT_DEFAULT, PRINT_COUNT_MAX
from client.admin_results import BrokerChange, BrokerConfig, BrokerStatus, FoundMessage
from client.mqadmin_args import (
    COUNT,
    OFFSET,
    QUEUE_ID,
    Parser,
    boolean,
    broker_or_cluster,
    cluster_or_broker,
    int_in,
    timestamp,
)
from client.mqadmin_output import (
    message_block,
    show_broker_config,
    show_broker_status,
    show_by_key,
    show_changes,
    show_cluster,
    show_connections,
    show_delete_topic,
    show_messages,
    show_print,
    show_progress,
    show_reset,
    show_route,
    show_sent,
    show_status,
    show_transfer,
)
from client.send_result import SendResult

TRANSFER_TIMEOUT_S_DEFAULT = 10.0  # leadershipTransfer waits this long for the new master

Run = Callable[[Admin, argparse.Namespace], Awaitable[Any]]  # the admin call, its result
Show = Callable[[Any, argparse.Namespace], str]  # the result as text


@attrs.frozen
class Command:
    """One mqadmin command: its name, a line for the overview, its flags, what it runs and how
    its result prints (`--json` prints `jsonable(result)` instead)."""

    name: str
    summary: str
    configure: Callable[[Parser], None]
    run: Run
    show: Show


def _cluster_list(p: Parser) -> None:
    p.add_argument(
        "-c", "--clusterName", dest="cluster", metavar="CLUSTER", help="only this cluster"
    )


def _topic(p: Parser) -> None:
    p.add_argument("-t", "--topic", required=True, metavar="TOPIC", help="topic name")


def _update_topic(p: Parser) -> None:
    cluster_or_broker(p, "create the topic on")
    _topic(p)
    p.add_argument(
        "-r",
        "--readQueueNums",
        dest="read",
        type=COUNT,
        default=QUEUES_DEFAULT,
        metavar="N",
        help=f"read queues (default {QUEUES_DEFAULT})",
    )
    p.add_argument(
        "-w",
        "--writeQueueNums",
        dest="write",
        type=COUNT,
        default=QUEUES_DEFAULT,
        metavar="N",
        help=f"write queues (default {QUEUES_DEFAULT})",
    )
    p.add_argument(
        "-p",
        "--perm",
        type=int_in(0, 7),
        default=PERM_DEFAULT,
        metavar="PERM",
        help=f"2 write, 4 read, 6 both (default {PERM_DEFAULT})",
    )
    p.add_argument(
        "-o",
        "--order",
        type=boolean,
        default=False,
        metavar="BOOL",
        help="an ordered topic (default false)",
    )


async def _run_update_topic(admin: Admin, a: argparse.Namespace) -> list[BrokerChange]:
    return await admin.update_topic(
        a.topic,
        cluster=a.cluster,
        broker=a.broker,
        read_queues=a.read,
        write_queues=a.write,
        perm=a.perm,
        order=a.order,
    )


def _delete_topic(p: Parser) -> None:
    p.add_argument(
        "-c",
        "--clusterName",
        dest="cluster",
        required=True,
        metavar="CLUSTER",
        help="delete it from every group of this cluster",
    )
    _topic(p)


def _group(p: Parser) -> None:
    p.add_argument(
        "-g", "--groupName", dest="group", required=True, metavar="GROUP", help="consumer group"
    )


def _update_group(p: Parser) -> None:
    cluster_or_broker(p, "create the group on")
    _group(p)
    p.add_argument(
        "-s", "--consumeEnable", type=boolean, default=True, metavar="BOOL", help="default true"
    )
    p.add_argument(
        "-d",
        "--consumeBroadcastEnable",
        type=boolean,
        default=True,
        metavar="BOOL",
        help="default true",
    )
    p.add_argument(
        "-q", "--retryQueueNums", type=int_in(0, 1024), default=1, metavar="N", help="default 1"
    )
    p.add_argument(
        "-r", "--retryMaxTimes", type=int_in(0, 1024), default=16, metavar="N", help="default 16"
    )


async def _run_update_group(admin: Admin, a: argparse.Namespace) -> list[BrokerChange]:
    return await admin.update_subscription_group(
        a.group,
        cluster=a.cluster,
        broker=a.broker,
        consume_enable=a.consumeEnable,
        broadcast_enable=a.consumeBroadcastEnable,
        retry_queues=a.retryQueueNums,
        retry_max_times=a.retryMaxTimes,
    )


def _delete_group(p: Parser) -> None:
    cluster_or_broker(p, "delete the group from")
    _group(p)


def _progress(p: Parser) -> None:
    _group(p)
    p.add_argument("-t", "--topic", metavar="TOPIC", help="only this topic")


async def _addresses(admin: Admin, a: argparse.Namespace) -> list[str]:
    return [a.broker] if a.broker else await admin.cluster_addresses(a.cluster)


async def _run_broker_status(admin: Admin, a: argparse.Namespace) -> list[BrokerStatus]:
    return [await admin.broker_status(address) for address in await _addresses(admin, a)]


async def _run_broker_config(admin: Admin, a: argparse.Namespace) -> list[BrokerConfig]:
    return [await admin.broker_config(address) for address in await _addresses(admin, a)]


def _by_id(p: Parser) -> None:
    p.add_argument(
        "-i", "--msgId", dest="msg_id", required=True, metavar="ID", help="offsetMsgId or UNIQ_KEY"
    )
    p.add_argument(
        "-t", "--topic", metavar="TOPIC", help="the topic (needed to look up a UNIQ_KEY)"
    )


def _by_key(p: Parser) -> None:
    _topic(p)
    p.add_argument(
        "-k",
        "--msgKey",
        dest="key",
        required=True,
        metavar="KEY",
        help="a key of KEYS, or a UNIQ_KEY",
    )
    p.add_argument(
        "-b",
        "--beginTimestamp",
        dest="begin",
        type=timestamp,
        default=0,
        metavar="TIME",
        help="stored at or after (default: ever)",
    )
    p.add_argument(
        "-e",
        "--endTimestamp",
        dest="end",
        type=timestamp,
        metavar="TIME",
        help="up to the last one stored before",
    )
    p.add_argument(
        "-m",
        "--maxNum",
        dest="max_num",
        type=int_in(1, 64),
        default=64,
        metavar="N",
        help="the newest N (1-64, default 64)",
    )


def _by_offset(p: Parser) -> None:
    _topic(p)
    p.add_argument(
        "-b", "--brokerName", dest="broker_name", required=True, metavar="NAME", help="broker group"
    )
    p.add_argument("-i", "--queueId", dest="queue_id", type=QUEUE_ID, required=True, metavar="N")
    p.add_argument("-o", "--offset", type=OFFSET, required=True, metavar="N", help="queue offset")


def _send(p: Parser) -> None:
    _topic(p)
    p.add_argument(
        "-p", "--body", required=True, metavar="BODY", help="the message body (UTF-8 text)"
    )
    p.add_argument("-k", "--key", metavar="KEYS", help="keys, space-separated")
    p.add_argument("-c", "--tags", metavar="TAG", help="the tag")
    p.add_argument(
        "-b", "--broker", dest="broker_name", metavar="NAME", help="send to this broker group"
    )
    p.add_argument(
        "-i", "--qid", dest="queue_id", type=QUEUE_ID, metavar="N", help="send to this queue"
    )


async def _run_send(admin: Admin, a: argparse.Namespace) -> SendResult:
    return await admin.send_message(
        a.topic,
        a.body.encode(),
        keys=a.key,
        tags=a.tags,
        broker_name=a.broker_name,
        queue_id=a.queue_id,
    )


def _print(p: Parser) -> None:
    _topic(p)
    p.add_argument(
        "-b",
        "--beginTimestamp",
        dest="begin",
        type=timestamp,
        metavar="TIME",
        help="from the first message stored then",
    )
    p.add_argument(
        "-e",
        "--endTimestamp",
        dest="end",
        type=timestamp,
        metavar="TIME",
        help="up to the last one stored before",
    )
    p.add_argument(
        "--beginOffset",
        type=OFFSET,
        metavar="N",
        help="from this offset of each queue, instead of -b",
    )
    p.add_argument(
        "--endOffset",
        type=OFFSET,
        metavar="N",
        help="up to before this offset of each queue, instead of -e",
    )
    p.add_argument(
        "-m",
        "--max",
        metavar="N",
        type=int_in(1, PRINT_COUNT_MAX),
        default=PRINT_COUNT_DEFAULT,
        help=f"print at most this many messages (default {PRINT_COUNT_DEFAULT})",
    )


async def _run_print(admin: Admin, a: argparse.Namespace) -> list[FoundMessage]:
    return await admin.print_messages(
        a.topic,
        begin_ms=a.begin,
        end_ms=a.end,
        begin_offset=a.beginOffset,
        end_offset=a.endOffset,
        count_max=a.max,
    )


def _reset(p: Parser) -> None:
    _group(p)
    _topic(p)
    p.add_argument(
        "-s",
        "--timestamp",
        type=timestamp,
        required=True,
        metavar="TIME",
        help="now, milliseconds, or yyyy-MM-dd#HH:mm:ss:SSS (local time)",
    )


def _transfer(p: Parser) -> None:
    p.add_argument(
        "-g", "--group", required=True, metavar="GROUP", help="the broker group (brokerName)"
    )
    p.add_argument(
        "-t", "--target", required=True, metavar="ID", help="the Raft id of the new leader (n1)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=TRANSFER_TIMEOUT_S_DEFAULT,
        metavar="S",
        help=f"seconds to wait (default {TRANSFER_TIMEOUT_S_DEFAULT:g})",
    )


COMMANDS = [
    Command(
        "clusterList",
        "List the broker groups and replicas of the clusters",
        _cluster_list,
        lambda admin, a: admin.cluster_list(a.cluster),
        show_cluster,
    ),
    Command(
        "topicList",
        "List every topic the name servers know",
        lambda p: None,
        lambda admin, a: admin.topic_list(),
        lambda topics, a: "\n".join(topics),
    ),
    Command(
        "topicRoute",
        "Show a topic's route",
        _topic,
        lambda admin, a: admin.topic_route(a.topic),
        show_route,
    ),
    Command(
        "topicStatus",
        "Show the offsets of each queue of a topic",
        _topic,
        lambda admin, a: admin.topic_status(a.topic),
        show_status,
    ),
    Command(
        "updateTopic",
        "Create or update a topic",
        _update_topic,
        _run_update_topic,
        show_changes("create", "topic"),
    ),
    Command(
        "deleteTopic",
        "Delete a topic from a cluster and the name servers",
        _delete_topic,
        lambda admin, a: admin.delete_topic(a.topic, cluster=a.cluster),
        show_delete_topic,
    ),
    Command(
        "updateSubGroup",
        "Create or update a subscription group",
        _update_group,
        _run_update_group,
        show_changes("create", "subscription group"),
    ),
    Command(
        "deleteSubGroup",
        "Delete a subscription group",
        _delete_group,
        lambda admin, a: admin.delete_subscription_group(
            a.group, cluster=a.cluster, broker=a.broker
        ),
        show_changes("delete", "subscription group", "from"),
    ),
    Command(
        "consumerProgress",
        "Show a consumer group's offsets and lag per queue",
        _progress,
        lambda admin, a: admin.consume_progress(a.group, a.topic),
        show_progress,
    ),
    Command(
        "consumerConnection",
        "Show a consumer group's live members",
        _group,
        lambda admin, a: admin.consumer_connections(a.group),
        show_connections,
    ),
    Command(
        "brokerStatus",
        "Show a broker's runtime statistics",
        broker_or_cluster,
        _run_broker_status,
        show_broker_status,
    ),
    Command(
        "getBrokerConfig",
        "Show a broker's configuration",
        broker_or_cluster,
        _run_broker_config,
        show_broker_config,
    ),
    Command(
        "queryMsgById",
        "Find a message by offsetMsgId or UNIQ_KEY",
        _by_id,
        lambda admin, a: admin.query_message_by_id(a.msg_id, a.topic),
        show_messages,
    ),
    Command(
        "queryMsgByKey",
        "Find messages by key",
        _by_key,
        lambda admin, a: admin.query_message_by_key(
            a.topic, a.key, begin_ms=a.begin, end_ms=a.end, max_num=a.max_num
        ),
        show_by_key,
    ),
    Command(
        "queryMsgByOffset",
        "Show the message at a queue offset",
        _by_offset,
        lambda admin, a: admin.query_message_by_offset(
            a.topic, a.broker_name, a.queue_id, a.offset
        ),
        lambda found, a: message_block(found),
    ),
    Command("sendMessage", "Send one message", _send, _run_send, show_sent),
    Command(
        "printMsg",
        "Print the messages of a topic in a time or offset range",
        _print,
        _run_print,
        show_print,
    ),
    Command(
        "resetOffsetByTime",
        "Move a consumer group's offsets to a point in time",
        _reset,
        lambda admin, a: admin.reset_offset_by_time(a.group, a.topic, a.timestamp),
        show_reset,
    ),
    Command(
        "leadershipTransfer",
        "Hand a broker group's leadership to one replica (DLedger)",
        _transfer,
        lambda admin, a: admin.leadership_transfer(a.group, a.target, timeout_s=a.timeout),
        show_transfer,
    ),
]
