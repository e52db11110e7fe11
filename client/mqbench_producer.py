"""`mqbench producer`: send in a loop for a while through the public AsyncProducer, counting.

Three modes, as RocketMQ's benchmark has (benchmark/producer.sh, batchproducer.sh):
- sync: `tasks` trio tasks, each sending one message and waiting for its answer, again;
- async: `tasks` tasks calling `send_async` without waiting for answers, at most `in_flight`
  sends outstanding at once (the callback frees a place);
- batch: `tasks` tasks, each sending `batch_size` messages with `send_batch` and waiting.
`auto_batch` gives the producer RocketMQ 5's automatic batching (client/auto_batch.py), so the
sync and async modes' concurrent sends share batch requests.

A send that raises counts as failed: "Response Failed" when a broker refused it
(MQBrokerError), "Send Failed" for everything else (unreachable, unknown outcome, no route),
RocketMQ's split. A task whose send failed pauses FAILURE_PAUSE_S before its next, so a dead
cluster is not hammered. The first failure of each kind is reported on stderr once.
"""

from __future__ import annotations

import enum
import random
import string
from collections.abc import Callable

import attrs
import trio

from client.errors import MQBrokerError, MQClientError
from client.message import Message
from client.mqbench_run import Run
from client.mqbench_stats import SendStats
from client.producer import AsyncProducer
from client.send_result import SendResult
from client.validation import check_message

PRODUCER_GROUP = "benchmark_producer"  # RocketMQ's benchmark uses this group too
FAILURE_PAUSE_S = 0.1  # a task's pause after a failed send


class Mode(enum.Enum):
    SYNC = "sync"
    ASYNC = "async"
    BATCH = "batch"


@attrs.frozen
class ProducerOptions:
    namesrv: str
    topic: str
    size: int  # body bytes
    tasks: int
    mode: Mode
    batch_size: int
    in_flight: int  # async mode: sends outstanding at once
    auto_batch: bool
    tags: str | None
    keys: bool  # a key per message (its sequence number), so the broker indexes each


class Messages:
    """The messages a run sends: one random body of `size` printable bytes, made once (bodies
    of 4 KiB or more are compressed by the producer, as RocketMQ clients do), the tag, and with
    keys a new Message per send carrying its sequence number."""

    def __init__(self, options: ProducerOptions, rng: random.Random | None = None) -> None:
        rng = rng or random.Random()
        alphabet = (string.ascii_letters + string.digits).encode()
        self._body = bytes(rng.choice(alphabet) for _ in range(options.size))
        self._topic, self._tags, self._keys = options.topic, options.tags, options.keys
        self._sequence = 0
        self._fixed = Message(self._topic, self._body, tags=self._tags)
        check_message(self._fixed)  # InvalidMessage now, not on every send

    def next(self) -> Message:
        if not self._keys:
            return self._fixed  # a Message is immutable; the producer gives each send its id
        self._sequence += 1
        return Message(self._topic, self._body, tags=self._tags, keys=str(self._sequence))


class FirstFailures:
    """Reports the first failure of each exception type, one line each."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._seen: set[type[BaseException]] = set()

    def saw(self, err: BaseException) -> None:
        if type(err) in self._seen:
            return
        self._seen.add(type(err))
        text = " ".join(str(err).split()) or type(err).__name__
        self._warn(f"a send failed ({type(err).__name__}; later ones only counted): {text}")


async def produce(
    options: ProducerOptions, run: Run, stats: SendStats, failures: FirstFailures
) -> None:
    """The producer run: start the producer, start the clock, send until the run stops, wait
    for the sends in flight."""
    messages = Messages(options)
    async with AsyncProducer(PRODUCER_GROUP, options.namesrv, auto_batch=options.auto_batch) as p:
        sender = _SENDERS[options.mode]
        window = trio.Semaphore(options.in_flight)
        run.start()
        async with trio.open_nursery() as senders:
            for _ in range(options.tasks):
                senders.start_soon(sender, p, options, messages, run, stats, failures, window)
    # leaving the producer's block waited for every async send still in flight


def _failed(err: MQClientError, messages: int, stats: SendStats, failures: FirstFailures) -> None:
    if isinstance(err, MQBrokerError):
        stats.response_failed(messages)
    else:
        stats.send_failed(messages)
    failures.saw(err)


async def _sync_sender(
    producer: AsyncProducer,
    options: ProducerOptions,
    messages: Messages,
    run: Run,
    stats: SendStats,
    failures: FirstFailures,
    window: trio.Semaphore,
) -> None:
    while run.going():
        message = messages.next()
        began = trio.current_time()
        try:
            await producer.send(message)
        except MQClientError as err:
            _failed(err, 1, stats, failures)
            await run.pause(FAILURE_PAUSE_S)
            continue
        stats.stored(1, (trio.current_time() - began) * 1000)


async def _batch_sender(
    producer: AsyncProducer,
    options: ProducerOptions,
    messages: Messages,
    run: Run,
    stats: SendStats,
    failures: FirstFailures,
    window: trio.Semaphore,
) -> None:
    while run.going():
        batch = [messages.next() for _ in range(options.batch_size)]
        began = trio.current_time()
        try:
            await producer.send_batch(batch)
        except MQClientError as err:  # batches before the failed one may be stored: uncounted
            _failed(err, len(batch), stats, failures)
            await run.pause(FAILURE_PAUSE_S)
            continue
        stats.stored(len(batch), (trio.current_time() - began) * 1000)


async def _async_sender(
    producer: AsyncProducer,
    options: ProducerOptions,
    messages: Messages,
    run: Run,
    stats: SendStats,
    failures: FirstFailures,
    window: trio.Semaphore,
) -> None:
    while run.going():
        await window.acquire()
        if not run.going():
            window.release()
            return
        began = trio.current_time()

        def done(outcome: SendResult | BaseException, began: float = began) -> None:
            window.release()
            if isinstance(outcome, SendResult):
                stats.stored(1, (trio.current_time() - began) * 1000)
            elif isinstance(outcome, MQClientError):
                _failed(outcome, 1, stats, failures)
            else:  # not the client's own error: a bug, counted and reported
                stats.send_failed(1)
                failures.saw(outcome)

        try:
            await producer.send_async(messages.next(), done)
        except MQClientError as err:
            window.release()
            _failed(err, 1, stats, failures)
            await run.pause(FAILURE_PAUSE_S)


_SENDERS = {Mode.SYNC: _sync_sender, Mode.ASYNC: _async_sender, Mode.BATCH: _batch_sender}
