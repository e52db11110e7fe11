"""The message workload of a broker run: producers and consumers through our client (client/),
every operation recorded in the history.

Producers (process "p<w>", trio AsyncProducer, sync sends with the producer's retries):
- plain senders put uniquely numbered values "p<w>-<n>" on TOPIC, any queue; after an unknown
  outcome a value is sent again, under the same UNIQ_KEY, half the time (as an application
  that retries a timed-out send would: that is how duplicates arise and get counted);
- ordered senders ("o<w>") put "<key>-<seq>" on ORDERED_TOPIC with client.hash_selector and
  the key as sharding argument, so one key keeps one queue. A value whose send did not end in
  SEND_OK is sent again, same UNIQ_KEY, until it does: the first copy of seq n is then always
  stored before anything of seq n + 1, which is what lets the order check dedupe.
  The keys are picked so that every queue of every group has one, and each ordered sender
  has keys of one group only: a group that does not answer stalls its own senders, not the
  others', so the longest stretch without a SEND_OK on a group is that group's.

Consumers (in clustering mode, each member its own client instance):
- CONCURRENT_GROUP: push consumers with a concurrent listener on TOPIC ("concurrent/<m>");
- ORDERLY_GROUP: push consumers with an orderly listener on ORDERED_TOPIC ("orderly/<m>");
- PULL_GROUP: one pull consumer on TOPIC ("pull/0") that pulls every queue, keeps its own
  offsets and commits them every COMMIT_S (each commit an operation);
- each member is restarted every RESTART_S (drawn): a push consumer shuts down (committing its
  offsets) and starts again; the pull consumer commits first only half the time, so a restart
  also rewinds to an older commit;
- a sampler ("offsets") asks the brokers for every group's committed offset of every queue
  every SAMPLE_S and records each change.

History operations (docs/formats.md, "Broker chaos history", has the full table):
    send      invoke {v, t, k}; ok adds {q, o, id} with group = the broker group, node = the
              replica that answered; fail (surely not stored) / info (unknown) with error
    consume   ok (an event) {cg, t, q, m: [[queue offset, value, msg id], ...]}, group
    commit    invoke/ok/fail {cg, t, q, o}, group                       (the pull consumer)
    committed ok (an event) {cg, t, q, o}, group                        (the sampler)
    take      ok (an event) {cg, t, q}, group: a member took a queue (at most TAKE_POLL_S
              late, and before it read the offset to start from)
    restart   ok (an event) {cg, member, commit: bool}                  (a consumer restarted)
"""

from __future__ import annotations

import logging
import random
import uuid
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from chaos.history import HistoryWriter, Phase
from client.admin import open_admin
from client.consumer_requests import ConsumerRequests
from client.errors import MQClientError, SendOutcomeUnknown
from client.instance import open_instance
from client.listeners import ConsumeOrderlyStatus, ConsumeStatus
from client.message import Message, MessageExt, MessageQueue
from client.producer import AsyncProducer
from client.pull_consumer import AsyncPullConsumer, PullStatus
from client.push_consumer import AsyncPushConsumer
from client.selectors import hash_selector
from client.send_result import SendResult
from dledger.exceptions import find
from remoting.message_id import parse_offset_msg_id

log = logging.getLogger("chaos.workloads.messages")

TOPIC = "ChaosTopic"
ORDERED_TOPIC = "ChaosOrdered"
TOPICS = (TOPIC, ORDERED_TOPIC)
QUEUES_PER_GROUP = 4
CLUSTER = "DefaultCluster"  # the brokers' default brokerClusterName
PRODUCER_GROUP = "chaos_producers"
CONCURRENT_GROUP = "chaos_concurrent"
ORDERLY_GROUP = "chaos_orderly"
PULL_GROUP = "chaos_pull"
CONSUMER_TOPICS = {CONCURRENT_GROUP: TOPIC, ORDERLY_GROUP: ORDERED_TOPIC, PULL_GROUP: TOPIC}

PRODUCERS_DEFAULT = 3
ORDERED_PRODUCERS_DEFAULT = 1  # per broker group
PUSH_MEMBERS_DEFAULT = 2  # per push group
SEND_TIMEOUT_S_DEFAULT = 3.0  # the client's default: one send, its retries included
RETRY_UNKNOWN = 0.5  # chance a plain sender re-sends a value whose outcome is unknown
PAUSE_AFTER_ERROR_S = 0.05
RESTART_S = (10.0, 30.0)  # a consumer member runs this long (drawn) between restarts
COMMIT_S = 1.0  # the pull consumer commits its offsets this often
SAMPLE_S = 0.5  # the committed-offset sampler's period
SAMPLE_TIMEOUT_S = 1.0  # one query of the sampler
TAKE_POLL_S = 0.1  # how often a push member's queues are looked at
PULL_BLOCK_S = 1.0  # the pull consumer's long poll per queue
PULL_TIMEOUT_S = 3.0
PULL_RETRY_S = 0.1
DRAIN_POLL_S = 0.2
ERROR_CHARS_MAX = 300
# The push consumers' settings: offsets committed every second (so restarts rewind little and
# often), rebalance and long polls short enough for a one-minute run.
PUSH_SETTINGS: dict[str, Any] = {
    "consume_from": "first",
    "persist_s": 1.0,
    "rebalance_s": 5.0,
    "long_poll_s": 5.0,
    "lock_renew_s": 5.0,
    "shutdown_wait_s": 3.0,
    "workers": 4,
}


def queue_name(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}"


def ordered_keys(groups: int, count: int) -> list[str]:
    """`count` sharding keys that hash_selector spreads over every queue of ORDERED_TOPIC
    (queues sorted by group then id, QUEUES_PER_GROUP each): key i lands on queue i mod the
    queue count."""
    total = groups * QUEUES_PER_GROUP
    keys: list[str] = []
    j = 0
    while len(keys) < count:
        candidate = f"k{j}"
        if zlib.crc32(candidate.encode()) % total == len(keys) % total:
            keys.append(candidate)
        j += 1
    return keys


def key_of(value: str) -> tuple[str, int]:
    """(key, seq) of an ordered value "<key>-<seq>" (or a plain value "p<w>-<n>")."""
    key, _, seq = value.rpartition("-")
    return key, int(seq)


def client_error(exc: Exception) -> MQClientError:
    """The client's error in `exc` (a consumer's nursery may wrap it in an ExceptionGroup);
    anything else is a bug and goes on up."""
    found = find(exc, MQClientError)
    if not isinstance(found, MQClientError):
        raise exc
    return found


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:ERROR_CHARS_MAX]


@attrs.define
class MessageWorkload:
    namesrv: str
    groups: list[str]
    rng: random.Random
    host_at: dict[str, str]  # "ip:port" of a replica -> its host, for the `node` of a send
    producers: int = PRODUCERS_DEFAULT
    ordered_producers: int = ORDERED_PRODUCERS_DEFAULT
    push_members: int = PUSH_MEMBERS_DEFAULT
    send_timeout_s: float = SEND_TIMEOUT_S_DEFAULT
    restart_s: tuple[float, float] = RESTART_S
    counts: Counter[str] = attrs.field(factory=Counter)  # for the progress line
    acked: dict[str, set[str]] = attrs.field(factory=dict)  # topic -> values sent ok
    consumed: dict[str, set[str]] = attrs.field(factory=dict)  # consumer group -> values

    def __attrs_post_init__(self) -> None:
        self.acked = {t: set() for t in TOPICS}
        self.consumed = {g: set() for g in CONSUMER_TOPICS}

    # --- setup ---------------------------------------------------------------------------------

    async def create_topics(self, timeout_s: float) -> None:
        """Both topics on every group, QUEUES_PER_GROUP queues each, seen by a fresh route."""
        async with open_admin(self.namesrv) as admin:
            with trio.fail_after(timeout_s):
                for topic in TOPICS:
                    await admin.update_topic(
                        topic,
                        cluster=CLUSTER,
                        read_queues=QUEUES_PER_GROUP,
                        write_queues=QUEUES_PER_GROUP,
                        order=topic == ORDERED_TOPIC,
                    )
                while True:
                    routes = [await admin.topic_route(t) for t in TOPICS]
                    if all(
                        len(r.write_queues()) == len(self.groups) * QUEUES_PER_GROUP for r in routes
                    ):
                        return
                    await trio.sleep(DRAIN_POLL_S)

    def queues(self) -> list[tuple[str, int]]:
        """(topic, queue id) of every queue of every group (each group has the same ids)."""
        return [(t, q) for t in TOPICS for q in range(QUEUES_PER_GROUP)]

    # --- producers -----------------------------------------------------------------------------

    async def run_producers(self, history: HistoryWriter, stop: trio.Event) -> None:
        """Send until `stop`; each sender finishes the send it has in flight."""
        keys = ordered_keys(len(self.groups), len(self.groups) * QUEUES_PER_GROUP)
        async with (
            AsyncProducer(
                PRODUCER_GROUP, self.namesrv, send_timeout=self.send_timeout_s
            ) as producer,
            trio.open_nursery() as nursery,
        ):
            for w in range(self.producers):
                nursery.start_soon(self._plain_sender, producer, w, history, stop)
            for g in range(len(self.groups)):  # a group's keys only: a stuck group stalls no other
                group_keys = keys[g * QUEUES_PER_GROUP : (g + 1) * QUEUES_PER_GROUP]
                for i in range(self.ordered_producers):
                    w = g * self.ordered_producers + i
                    mine = group_keys[i :: self.ordered_producers]
                    nursery.start_soon(self._ordered_sender, producer, w, mine, history, stop)

    async def _plain_sender(
        self, producer: AsyncProducer, w: int, history: HistoryWriter, stop: trio.Event
    ) -> None:
        rng = random.Random(self.rng.random())
        n = 0
        retry: tuple[str, str] | None = None
        while not stop.is_set():
            if retry is not None:
                (value, uniq), retry = retry, None
            else:
                value, uniq = f"p{w}-{n}", uuid.uuid4().hex.upper()
                n += 1
            outcome = await self._send(producer, f"p{w}", TOPIC, value, uniq, None, history)
            if outcome is Phase.INFO and rng.random() < RETRY_UNKNOWN:
                retry = (value, uniq)
            if outcome is not Phase.OK:
                await trio.sleep(PAUSE_AFTER_ERROR_S)

    async def _ordered_sender(
        self,
        producer: AsyncProducer,
        w: int,
        keys: Sequence[str],
        history: HistoryWriter,
        stop: trio.Event,
    ) -> None:
        seqs = dict.fromkeys(keys, 0)
        turn = 0
        while not stop.is_set():
            key = keys[turn % len(keys)]
            turn += 1
            value, uniq = f"{key}-{seqs[key]}", uuid.uuid4().hex.upper()
            seqs[key] += 1
            while (
                await self._send(producer, f"o{w}", ORDERED_TOPIC, value, uniq, key, history)
                is not Phase.OK
            ):
                if stop.is_set():
                    return
                await trio.sleep(PAUSE_AFTER_ERROR_S)

    async def _send(
        self,
        producer: AsyncProducer,
        process: str,
        topic: str,
        value: str,
        uniq: str,
        key: str | None,
        history: HistoryWriter,
    ) -> Phase:
        asked = {"v": value, "t": topic, "k": key, "id": uniq}
        message = Message(topic, value.encode(), keys=value, properties={"UNIQ_KEY": uniq})
        history.record(process, Phase.INVOKE, "send", asked, group="")
        try:
            if key is None:
                result = await producer.send(message)
            else:
                result = await producer.send(message, selector=hash_selector, arg=key)
        except trio.Cancelled:
            history.record(
                process, Phase.INFO, "send", asked, error="the run was stopped", group=""
            )
            raise
        except SendOutcomeUnknown as err:
            return self._failed(history, process, Phase.INFO, asked, err)
        except MQClientError as err:
            return self._failed(history, process, Phase.FAIL, asked, err)
        except Exception as err:  # a client bug: we cannot say it was not stored
            log.exception("send of %s", value)
            return self._failed(history, process, Phase.INFO, asked, err)
        self.counts["ok"] += 1
        self.acked[topic].add(value)
        history.record(
            process,
            Phase.OK,
            "send",
            {
                **asked,
                "q": result.queue.queue_id,
                "o": result.queue_offset,
                "status": result.status.value,
            },
            group=result.queue.broker_name,
            node=self._answered_by(result),
        )
        return Phase.OK

    def _failed(
        self,
        history: HistoryWriter,
        process: str,
        phase: Phase,
        asked: dict[str, Any],
        err: BaseException,
    ) -> Phase:
        self.counts[phase.value] += 1
        history.record(process, phase, "send", asked, error=_error(err), group="")
        return phase

    def _answered_by(self, result: SendResult) -> str | None:
        """The replica that stored it: the store host of its offsetMsgId."""
        try:
            (host, port), _ = parse_offset_msg_id(result.offset_msg_id.split(",")[0])
        except ValueError:
            return None
        return self.host_at.get(f"{host}:{port}")

    # --- consumers -----------------------------------------------------------------------------

    async def run_consumers(self, history: HistoryWriter, stop: trio.Event) -> None:
        """Consume until `stop`, restarting members now and then; each closes cleanly."""
        async with trio.open_nursery() as nursery:
            for m in range(self.push_members):
                nursery.start_soon(self._push_member, CONCURRENT_GROUP, m, False, history, stop)
                nursery.start_soon(self._push_member, ORDERLY_GROUP, m, True, history, stop)
            nursery.start_soon(self._pull_member, 0, history, stop)
            nursery.start_soon(self._sample_offsets, history, stop)

    def _record_consumed(
        self, history: HistoryWriter, process: str, group: str, messages: Sequence[MessageExt]
    ) -> None:
        by_queue: dict[MessageQueue, list[list[Any]]] = {}
        for m in messages:
            value = m.body.decode(errors="replace")
            by_queue.setdefault(m.queue, []).append([m.queue_offset, value, m.msg_id])
            self.consumed[group].add(value)
        for queue, rows in by_queue.items():
            history.record(
                process,
                Phase.OK,
                "consume",
                {"cg": group, "t": queue.topic, "q": queue.queue_id, "m": rows},
                group=queue.broker_name,
            )
        self.counts[group] += len(messages)

    async def _until(self, stop: trio.Event, seconds: float) -> bool:
        """Wait `seconds` or until `stop`; whether the run is stopping."""
        with trio.move_on_after(seconds):
            await stop.wait()
        return stop.is_set()

    async def _push_member(
        self, group: str, m: int, orderly: bool, history: HistoryWriter, stop: trio.Event
    ) -> None:
        rng = random.Random(self.rng.random())
        kind = "orderly" if orderly else "concurrent"
        process = f"{kind}/{m}"

        async def concurrent(messages: list[MessageExt]) -> ConsumeStatus:
            self._record_consumed(history, process, group, messages)
            return ConsumeStatus.CONSUME_SUCCESS

        async def in_order(messages: list[MessageExt]) -> ConsumeOrderlyStatus:
            self._record_consumed(history, process, group, messages)
            return ConsumeOrderlyStatus.SUCCESS

        first = True
        while not stop.is_set():
            if not first:
                history.record(
                    process,
                    Phase.OK,
                    "restart",
                    {"cg": group, "member": process, "commit": True},
                    group="",
                )
            first = False
            consumer = AsyncPushConsumer(
                group, self.namesrv, instance_name=f"{kind}-{m}", **PUSH_SETTINGS
            )
            consumer.subscribe(CONSUMER_TOPICS[group], "*")
            if orderly:
                consumer.register_orderly_listener(in_order)
            else:
                consumer.register_listener(concurrent)
            try:
                async with consumer, trio.open_nursery() as watching:
                    watching.start_soon(self._watch_takes, consumer, process, group, history)
                    await self._until(stop, rng.uniform(*self.restart_s))
                    watching.cancel_scope.cancel()
            except Exception as exc:  # start or shutdown failed: say so, start again
                err = client_error(exc)
                log.warning("%s: %s", process, err)
                history.record(
                    process,
                    Phase.OK,
                    "consumer-error",
                    {"cg": group, "error": _error(err)},
                    group="",
                )
                await self._until(stop, 1.0)

    async def _watch_takes(
        self, consumer: AsyncPushConsumer, process: str, group: str, history: HistoryWriter
    ) -> None:
        """Record each queue this member takes, within TAKE_POLL_S of the rebalance that gave
        it (before the member has read where to start: the rewind check needs that bound)."""
        owned: set[MessageQueue] = set()
        while True:
            now = set(consumer.assigned_queues())
            for queue in sorted(now - owned):
                self._record_take(history, process, group, queue)
            owned = now
            await trio.sleep(TAKE_POLL_S)

    def _record_take(
        self, history: HistoryWriter, process: str, group: str, queue: MessageQueue
    ) -> None:
        history.record(
            process,
            Phase.OK,
            "take",
            {"cg": group, "t": queue.topic, "q": queue.queue_id},
            group=queue.broker_name,
        )

    async def _pull_member(self, m: int, history: HistoryWriter, stop: trio.Event) -> None:
        rng = random.Random(self.rng.random())
        process = f"pull/{m}"
        committed_at_exit: bool | None = None  # None before the first session
        while not stop.is_set():
            if committed_at_exit is not None:
                history.record(
                    process,
                    Phase.OK,
                    "restart",
                    {"cg": PULL_GROUP, "member": process, "commit": committed_at_exit},
                    group="",
                )
            committed_at_exit = False
            try:
                async with AsyncPullConsumer(
                    PULL_GROUP, self.namesrv, instance_name=f"pull-{m}"
                ) as consumer:
                    committed_at_exit = await self._pull_session(
                        consumer, process, history, stop, rng
                    )
            except Exception as exc:  # a route or an offset could not be had: start again
                err = client_error(exc)
                log.warning("%s: %s", process, err)
                history.record(
                    process,
                    Phase.OK,
                    "consumer-error",
                    {"cg": PULL_GROUP, "error": _error(err)},
                    group="",
                )
                await self._until(stop, 1.0)

    async def _pull_session(
        self,
        consumer: AsyncPullConsumer,
        process: str,
        history: HistoryWriter,
        stop: trio.Event,
        rng: random.Random,
    ) -> bool:
        """Pull every queue until the session's time is up; whether it committed at the end
        (always when the run stops, else half the time: a crash leaves the last commit)."""
        queues = await consumer.fetch_queues(TOPIC)
        offsets: dict[MessageQueue, int] = {}
        committed: dict[MessageQueue, int] = {}
        for queue in queues:
            self._record_take(history, process, PULL_GROUP, queue)
        for queue in queues:
            offset = await consumer.fetch_offset(queue)
            offsets[queue] = committed[queue] = offset or 0
        lock = trio.Lock()  # the process's operations never overlap in the history
        session = trio.Event()
        async with trio.open_nursery() as nursery:
            for queue in queues:
                nursery.start_soon(
                    self._pull_queue, consumer, queue, offsets, process, history, session, lock
                )
            nursery.start_soon(
                self._commit_loop, consumer, offsets, committed, process, history, session, lock
            )
            stopping = await self._until(stop, rng.uniform(*self.restart_s))
            session.set()
        commit = stopping or rng.random() < 0.5
        if commit:
            await self._commit(consumer, offsets, committed, process, history, lock)
        return commit

    async def _pull_queue(
        self,
        consumer: AsyncPullConsumer,
        queue: MessageQueue,
        offsets: dict[MessageQueue, int],
        process: str,
        history: HistoryWriter,
        session: trio.Event,
        lock: trio.Lock,
    ) -> None:
        while not session.is_set():
            try:
                with trio.move_on_after(PULL_TIMEOUT_S + PULL_BLOCK_S + 1.0):
                    result = await consumer.pull(
                        queue, offsets[queue], timeout=PULL_TIMEOUT_S, block_s=PULL_BLOCK_S
                    )
            except MQClientError as err:
                log.info("%s: pull of %s: %s", process, queue, err)
                await trio.sleep(PULL_RETRY_S)
                continue
            if session.is_set():
                return  # the session ended while the pull was out: its messages are not taken
            if result.status is PullStatus.FOUND:
                async with lock:
                    self._record_consumed(history, process, PULL_GROUP, result.messages)
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                history.record(
                    process,
                    Phase.OK,
                    "offset-moved",
                    {
                        "cg": PULL_GROUP,
                        "t": queue.topic,
                        "q": queue.queue_id,
                        "from": offsets[queue],
                        "to": result.next_begin_offset,
                    },
                    group=queue.broker_name,
                )
            offsets[queue] = result.next_begin_offset

    async def _commit_loop(
        self,
        consumer: AsyncPullConsumer,
        offsets: dict[MessageQueue, int],
        committed: dict[MessageQueue, int],
        process: str,
        history: HistoryWriter,
        session: trio.Event,
        lock: trio.Lock,
    ) -> None:
        while not await self._until(session, COMMIT_S):
            await self._commit(consumer, offsets, committed, process, history, lock)

    async def _commit(
        self,
        consumer: AsyncPullConsumer,
        offsets: dict[MessageQueue, int],
        committed: dict[MessageQueue, int],
        process: str,
        history: HistoryWriter,
        lock: trio.Lock,
    ) -> None:
        for queue, offset in sorted(offsets.items()):
            if committed.get(queue) == offset:
                continue
            value = {"cg": PULL_GROUP, "t": queue.topic, "q": queue.queue_id, "o": offset}
            async with lock:
                history.record(process, Phase.INVOKE, "commit", value, group=queue.broker_name)
                try:
                    await consumer.commit_offset(queue, offset)
                except MQClientError as err:
                    history.record(
                        process,
                        Phase.FAIL,
                        "commit",
                        value,
                        error=_error(err),
                        group=queue.broker_name,
                    )
                    continue
                except trio.Cancelled:
                    history.record(
                        process,
                        Phase.INFO,
                        "commit",
                        value,
                        error="the run was stopped",
                        group=queue.broker_name,
                    )
                    raise
                history.record(process, Phase.OK, "commit", value, group=queue.broker_name)
                committed[queue] = offset

    async def _sample_offsets(self, history: HistoryWriter, stop: trio.Event) -> None:
        last: dict[tuple[str, MessageQueue], int] = {}
        async with open_instance(self.namesrv, "offset-sampler") as instance:
            requests = ConsumerRequests(instance)
            while not await self._until(stop, SAMPLE_S):
                for group, topic in CONSUMER_TOPICS.items():
                    try:
                        route = await instance.route(topic)
                    except MQClientError:
                        continue
                    for queue in route.read_queues():
                        offset: int | None = None
                        try:
                            with trio.move_on_after(SAMPLE_TIMEOUT_S):
                                offset = await requests.query_offset(group, queue)
                        except MQClientError:
                            continue
                        if offset is None or last.get((group, queue)) == offset:
                            continue
                        last[(group, queue)] = offset
                        history.record(
                            "offsets",
                            Phase.OK,
                            "committed",
                            {"cg": group, "t": topic, "q": queue.queue_id, "o": offset},
                            group=queue.broker_name,
                        )

    # --- the end -------------------------------------------------------------------------------

    def missing(self) -> dict[str, int]:
        """Per consumer group, acknowledged values of its topic it has not consumed yet."""
        return {g: len(self.acked[t] - self.consumed[g]) for g, t in CONSUMER_TOPICS.items()}

    async def wait_drained(self, timeout_s: float) -> bool:
        """Until every consumer group has consumed every acknowledged value of its topic."""
        with trio.move_on_after(timeout_s):
            while any(self.missing().values()):
                await trio.sleep(DRAIN_POLL_S)
            return True
        return False
