"""`mqbench consumer`: a push consumer that counts what it receives and how late it arrives.

One AsyncPushConsumer (clustering, a concurrent `async def` listener on the trio loop, so no
worker thread sits between the pull and the count) subscribes to the topic. For each message
the listener records, in milliseconds on this host's clock, born-to-receive (B2C: from the
producer's born timestamp, the end-to-end latency when producer and consumer share a clock)
and store-to-receive (S2C: from the broker's store timestamp), as RocketMQ's consumer.sh does.
Every message is acknowledged (CONSUME_SUCCESS), so offsets move on as it runs.
"""

from __future__ import annotations

import time
from typing import Literal

import attrs

from client.listeners import ConsumeStatus
from client.message import MessageExt
from client.mqbench_run import Run
from client.mqbench_stats import ReceiveStats
from client.push_config import PULL_BATCH_MAX
from client.push_consumer import AsyncPushConsumer

CONSUME_BATCH = PULL_BATCH_MAX  # messages per listener call: a pull's worth, one call


@attrs.frozen
class ConsumerOptions:
    namesrv: str
    topic: str
    group: str
    consume_from: Literal["first", "last"]  # where a group with no stored offset starts
    expression: str  # tag filter, "*" for all


async def consume(options: ConsumerOptions, run: Run, stats: ReceiveStats) -> None:
    """Consume until the run stops; the consumer commits its offsets on the way out."""

    async def listener(messages: list[MessageExt]) -> ConsumeStatus:
        now_ms = time.time_ns() / 1_000_000
        for message in messages:
            stats.received(now_ms - message.born_timestamp_ms, now_ms - message.store_timestamp_ms)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = AsyncPushConsumer(
        options.group,
        options.namesrv,
        consume_from=options.consume_from,
        consume_batch_size=CONSUME_BATCH,
    )
    consumer.subscribe(options.topic, options.expression)
    consumer.register_listener(listener)
    async with consumer:
        run.start()
        await run.wait_end()
        run.finish()  # the summary's duration: the consumer's shutdown is not part of it
