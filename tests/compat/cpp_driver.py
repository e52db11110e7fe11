"""Drive the Apache RocketMQ C++ client (PyPI `rocketmq` 0.4.4, librocketmq.so inside) through
one scenario and print one JSON line of what happened, as the last line on stdout.

Run it as a subprocess, never import it into pytest: the native library starts threads of its
own and can hang or crash its process.

    python cpp_driver.py --namesrv "127.0.0.1:9876" --topic T --group G [--timeout S] SCENARIO ...

Scenarios (every message carries tags, keys and the user properties `seq` and `scenario`):
    send-sync N            {"sent": [{"seq", "status", "msg_id", "offset"}], "errors": [...]}
    send-oneway N          {"sent": N, "errors": [...]}
    send-orderly N KEYS    sharding key seq % KEYS (property `shard`): {"sent": [{"seq", "shard",
                           "status", "msg_id", "offset"}], "errors": [...]}
    push-consume N         clustering push consumer until N distinct messages or --timeout:
                           {"received": [message...]} (message: body, tags, keys, properties,
                           topic, msg_id, queue_id, queue_offset, reconsume_times, thread)
    push-orderly N         the same with the orderly listener (queue locks)
    push-reconsume N       a push consumer that fails each message's first delivery (the binding
                           answers RECONSUME_LATER when the listener raises), until N messages
                           came back with reconsume_times >= 1: {"received": [message...]}
    pull N                 pull consumer over all queues from offset 0, until N or --timeout
    send-through-failover SECONDS
                           one send_sync every 20 ms for SECONDS: {"sends": [{"seq", "start",
                           "end", "ok", "msg_id" | "error"}]} (wall-clock seconds)

--expect-file PATH (consumers): once PATH holds a JSON list of bodies, stop as soon as every
one of them was received (N may then be 0). --progress-file PATH (failover): the number of
successful sends so far, rewritten after each one, so a test knows when to kill a leader.
The exit code is 0 when the scenario ran (its errors are in the JSON), 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

SEND_INTERVAL_S = 0.02  # send-through-failover: one send per 20 ms
SHUTDOWN_TIMEOUT_S = 10.0  # the native shutdown can hang; we exit anyway after printing
POLL_S = 0.05
PROPERTIES = ("seq", "scenario", "shard", "UNIQ_KEY", "KEYS", "TAGS", "RETRY_TOPIC")


def text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def make_message(topic: str, scenario: str, seq: int, **properties: str) -> Any:
    from rocketmq.client import Message

    msg = Message(topic)
    msg.set_body(f"{scenario}-{seq}")
    msg.set_tags(f"Tag{seq % 3}")
    msg.set_keys(f"key-{seq}")
    msg.set_property("seq", str(seq))
    msg.set_property("scenario", scenario)
    for key, value in properties.items():
        msg.set_property(key, value)
    return msg


def describe(msg: Any) -> dict[str, Any]:
    """What a test checks of a received message (a RecvMessage, valid only in its callback)."""
    return {
        "body": text(msg.body),
        "tags": text(msg.tags),
        "keys": text(msg.keys),
        "properties": {p: v for p in PROPERTIES if (v := text(msg.get_property(p))) is not None},
        "topic": text(msg.topic),
        "msg_id": text(msg.id),
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "reconsume_times": msg.reconsume_times,
        "thread": threading.get_ident(),
    }


def new_producer(args: argparse.Namespace) -> Any:
    from rocketmq.client import Producer

    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    return producer


# librocketmq 0.4.4 fails a send at once, without reaching any broker, when another of its
# threads holds its transport table (its log: "GetTransport ... get timed_mutex timeout" five
# times in a millisecond), and reports it as "No route info of this topic". An application
# resends such a send; so does this driver, a few times (docs/decisions.md).
NOT_SENT_MARK = "No route info of this topic"
NOT_SENT_RESENDS = 3
NOT_SENT_PAUSE_S = 0.2


def resending(send: Any, *args: Any) -> Any:
    for _ in range(NOT_SENT_RESENDS):
        try:
            return send(*args)
        except Exception as err:
            if NOT_SENT_MARK not in str(err):
                raise
            time.sleep(NOT_SENT_PAUSE_S)  # let the client's own thread release its table
    return send(*args)


def send_sync(args: argparse.Namespace, producer: Any) -> dict[str, Any]:
    sent, errors = [], []
    for seq in range(args.n):
        try:
            r = resending(producer.send_sync, make_message(args.topic, "sync", seq))
            sent.append(
                {"seq": seq, "status": r.status.name, "msg_id": r.msg_id, "offset": r.offset}
            )
        except Exception as err:
            errors.append({"seq": seq, "error": repr(err)})
    return {"sent": sent, "errors": errors}


def send_oneway(args: argparse.Namespace, producer: Any) -> dict[str, Any]:
    errors = []
    for seq in range(args.n):
        try:
            resending(producer.send_oneway, make_message(args.topic, "oneway", seq))
        except Exception as err:
            errors.append({"seq": seq, "error": repr(err)})
    return {"sent": args.n - len(errors), "errors": errors}


def send_orderly(args: argparse.Namespace, producer: Any) -> dict[str, Any]:
    sent, errors = [], []
    for seq in range(args.n):
        shard = seq % args.keys
        msg = make_message(args.topic, "orderly", seq, shard=str(shard))
        try:
            # no retries inside librocketmq: its retry of an orderly send picks another queue
            # (sendAutoRetrySelectImpl, "with times:2"), breaking the key's order after its
            # connection-table glitch; resending() sends again through the same selector
            r = resending(partial(producer.send_orderly, retry_times=0), msg, shard)
            sent.append(
                {
                    "seq": seq,
                    "shard": shard,
                    "status": r.status.name,
                    "msg_id": r.msg_id,
                    "offset": r.offset,
                }
            )
        except Exception as err:
            errors.append({"seq": seq, "shard": shard, "error": repr(err)})
    return {"sent": sent, "errors": errors}


def send_through_failover(args: argparse.Namespace, producer: Any) -> dict[str, Any]:
    sends: list[dict[str, Any]] = []
    oks = 0
    end = time.monotonic() + args.seconds
    seq = 0
    while time.monotonic() < end:
        started = time.monotonic()
        record: dict[str, Any] = {"seq": seq, "start": time.time()}
        try:
            r = producer.send_sync(make_message(args.topic, "failover", seq))
            record.update(ok=True, msg_id=r.msg_id, status=r.status.name, offset=r.offset)
            oks += 1
        except Exception as err:
            record.update(ok=False, error=repr(err))
        record["end"] = time.time()
        sends.append(record)
        if args.progress_file:
            tmp = Path(args.progress_file + ".tmp")
            tmp.write_text(str(oks))
            tmp.replace(args.progress_file)
        seq += 1
        time.sleep(max(0.0, SEND_INTERVAL_S - (time.monotonic() - started)))  # the send rate
    return {"sends": sends}


class Inbox:
    """Messages received by a consumer's callback threads, and when to stop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.want = args.n
        self.expect_file = Path(args.expect_file) if args.expect_file else None
        self.lock = threading.Lock()
        self.received: list[dict[str, Any]] = []
        self.bodies: set[str | None] = set()

    def add(self, message: dict[str, Any]) -> None:
        with self.lock:
            self.received.append(message)
            self.bodies.add(message["body"])

    def done(self) -> bool:
        with self.lock:
            if self.want and len(self.bodies) >= self.want:
                return True
            if self.expect_file is not None and self.expect_file.exists():
                expected = set(json.loads(self.expect_file.read_text()))
                return expected <= self.bodies
            return False

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.done():
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True


def push_consume(args: argparse.Namespace, orderly: bool) -> tuple[dict[str, Any], Any]:
    from rocketmq.client import PushConsumer

    inbox = Inbox(args)
    consumer = PushConsumer(args.group, orderly=orderly)
    consumer.set_namesrv_addr(args.namesrv)

    def on_message(msg: Any) -> None:  # returning is CONSUME_SUCCESS in this binding
        inbox.add(describe(msg))

    consumer.subscribe(args.topic, on_message, args.expression)
    consumer.start()
    complete = inbox.wait(args.timeout)
    with inbox.lock:
        return {"received": list(inbox.received), "complete": complete}, consumer


def push_reconsume(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from rocketmq.client import PushConsumer

    inbox = Inbox(args)
    inbox.want = 0  # done by the retried ones below, not by distinct bodies
    retried: set[str | None] = set()
    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)

    def on_message(msg: Any) -> None:
        message = describe(msg)
        inbox.add(message)
        if message["reconsume_times"] == 0:
            raise RuntimeError("failing the first delivery")  # RECONSUME_LATER
        with inbox.lock:
            retried.add(message["body"])

    consumer.subscribe(args.topic, on_message, args.expression)
    consumer.start()
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        with inbox.lock:
            if len(retried) >= args.n:
                break
        time.sleep(POLL_S)
    with inbox.lock:
        complete = len(retried) >= args.n
        return {"received": list(inbox.received), "complete": complete}, consumer


def pull(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The binding's own PullConsumer.pull keeps offsets by topic@queueId, without the broker
    name, so with two broker groups one group's offsets overwrite the other's (rocketmq 0.4.4,
    client.py _get_mq_key) and a whole group's messages are skipped. This loop calls the
    library's Pull itself and keeps offsets by (broker, queue)."""
    import ctypes

    from rocketmq.client import (
        POINTER,
        PullConsumer,
        RecvMessage,
        _CMessageQueue,
        _CPullStatus,
        _to_bytes,
        c_int,
        dll,
        ffi_check,
    )

    inbox = Inbox(args)
    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.start()
    deadline = time.monotonic() + args.timeout
    errors: list[str] = []
    offsets: dict[tuple[bytes, int], int] = {}
    while not inbox.done() and time.monotonic() < deadline:
        got = 0
        queues = POINTER(_CMessageQueue)()
        count = c_int()
        try:
            ffi_check(
                dll.FetchSubscriptionMessageQueues(
                    consumer._handle,
                    _to_bytes(args.topic),
                    ctypes.pointer(queues),
                    ctypes.pointer(count),
                )
            )
        except Exception as err:
            errors.append(repr(err))
            time.sleep(POLL_S)
            continue
        for i in range(count.value):
            mq = queues[i]
            key = (bytes(mq.brokerName), int(mq.queueId))
            while True:
                offset = offsets.get(key, 0)
                result = dll.Pull(
                    consumer._handle, ctypes.pointer(mq), _to_bytes(args.expression),
                    ctypes.c_longlong(offset), 32,
                )  # fmt: skip
                status = result.pullStatus
                if status != _CPullStatus.BROKER_TIMEOUT:
                    offsets[key] = int(result.nextBeginOffset)
                if status == _CPullStatus.FOUND:
                    for k in range(int(result.size)):
                        inbox.add(describe(RecvMessage(result.msgFoundList[k])))
                        got += 1
                dll.ReleasePullResult(result)
                if status not in (_CPullStatus.FOUND, _CPullStatus.NO_MATCHED_MSG):
                    break
        dll.ReleaseSubscriptionMessageQueue(queues)
        if not got:
            time.sleep(POLL_S)  # nothing new (or no queues yet): pause rather than spin
    return {"received": inbox.received, "complete": inbox.done(), "errors": errors[-20:]}, consumer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cpp_driver", description=__doc__)
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="cpp_driver")
    p.add_argument("--timeout", type=float, default=60.0, help="consumers: give up after this")
    p.add_argument("--expression", default="*")
    p.add_argument("--expect-file")
    p.add_argument("--progress-file")
    sub = p.add_subparsers(dest="scenario", required=True)
    for name in (
        "send-sync",
        "send-oneway",
        "push-consume",
        "push-orderly",
        "push-reconsume",
        "pull",
    ):
        sub.add_parser(name).add_argument("n", type=int)
    orderly = sub.add_parser("send-orderly")
    orderly.add_argument("n", type=int)
    orderly.add_argument("keys", type=int)
    sub.add_parser("send-through-failover").add_argument("seconds", type=float)
    return p


def run(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """(result, the client to shut down)."""
    if args.scenario in ("push-consume", "push-orderly"):
        return push_consume(args, orderly=args.scenario == "push-orderly")
    if args.scenario == "push-reconsume":
        return push_reconsume(args)
    if args.scenario == "pull":
        return pull(args)
    producer = new_producer(args)
    scenarios = {
        "send-sync": send_sync,
        "send-oneway": send_oneway,
        "send-orderly": send_orderly,
        "send-through-failover": send_through_failover,
    }
    return scenarios[args.scenario](args, producer), producer


def main() -> None:
    args = build_parser().parse_args()
    started = time.time()
    result, client = run(args)
    result.update(scenario=args.scenario, started=started, finished=time.time())
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    # The result is out; a native shutdown that hangs must not hold the test up.
    threading.Timer(SHUTDOWN_TIMEOUT_S, lambda: os._exit(0)).start()
    try:
        client.shutdown()
    finally:
        os._exit(0)  # skip the binding's __del__, which shuts down (again) at exit


if __name__ == "__main__":
    main()
