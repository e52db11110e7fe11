"""A push consumer's settings, checked when built, with RocketMQ's defaults and names.

| setting | default | RocketMQ's name |
|---|---|---|
| `model` | "clustering" | messageModel (CLUSTERING: the group shares the queues; BROADCASTING: every member gets every message) |
| `consume_from` | "last" | consumeFromWhere: where a queue starts when the group has no stored offset: "last", "first", or ("timestamp", ms) |
| `allocate` | "averagely" | allocateMessageQueueStrategy: "averagely", "consistent_hash", or a function (client/rebalance.py) |
| `pull_batch_size` | 32 | pullBatchSize (a broker returns at most 32) |
| `consume_batch_size` | 1 | consumeMessageBatchMaxSize |
| `workers` | 20 | consumeThreadMax: listeners running at once (threads for a plain-function listener) |
| `flow` | 1000 messages, 100 MiB, span 2000 | pullThresholdForQueue, pullThresholdSizeForQueue, consumeConcurrentlyMaxSpan |
| `suspend_s` | 1.0 | suspendCurrentQueueTimeMillis: the pause after SUSPEND_CURRENT_QUEUE_A_MOMENT |
| `retry_delay_s`, `retry_delay_max_s` | 1.0, 60.0 | the local retry of RECONSUME_LATER (below) |
| `max_reconsume_times` | 16 | maxReconsumeTimes, sent with CONSUMER_SEND_MSG_BACK |
| `offset_dir` | ~/.rocketmq_offsets | broadcasting offsets (client/offset_store.py) |
| `long_poll_s` | 15.0 | brokerSuspendMaxTimeMillis |
| `rebalance_s`, `persist_s`, `lock_renew_s` | 20, 5, 20 | rebalance, offset commit and lock renewal intervals |
| `shutdown_wait_s` | 10.0 | how long shutdown waits for listeners still running |

RECONSUME_LATER: in clustering mode the consumer first asks the broker to take the message
back (CONSUMER_SEND_MSG_BACK; a Java broker re-delivers it later through %RETRY%<group>). Our
broker does not serve that request yet, so the message is retried here instead: it stays in
its queue's process queue (its offset is not committed, so a crash re-delivers it) and goes to
the listener again after retry_delay_s, doubling per attempt up to retry_delay_max_s, with
reconsume_times counting the attempts, for as long as it takes (at-least-once: never skipped).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from client.process_queue import FlowLimits
from client.rebalance import Allocator, allocate_averagely, allocator

CLUSTERING, BROADCASTING = "clustering", "broadcasting"
ConsumeFrom = Literal["last", "first"] | tuple[str, int]
CONSUME_FROM_NAMES = {
    "last": "CONSUME_FROM_LAST_OFFSET",
    "first": "CONSUME_FROM_FIRST_OFFSET",
    "timestamp": "CONSUME_FROM_TIMESTAMP",
}
PULL_BATCH_MAX = 32


def _check_consume_from(instance: object, attribute: object, value: object) -> None:
    if value in ("last", "first"):
        return
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and value[0] == "timestamp"
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    ):
        return
    raise ValueError(f'consume_from must be "last", "first" or ("timestamp", ms), not {value!r}')


def _positive(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, not {value!r}")


@attrs.frozen
class PushConfig:
    model: str = attrs.field(
        default=CLUSTERING, validator=attrs.validators.in_((CLUSTERING, BROADCASTING))
    )
    consume_from: ConsumeFrom = attrs.field(default="last", validator=_check_consume_from)
    allocate: Allocator = attrs.field(default=allocate_averagely, converter=allocator)
    pull_batch_size: int = attrs.field(
        default=32, validator=[_positive, attrs.validators.le(PULL_BATCH_MAX)]
    )
    consume_batch_size: int = attrs.field(default=1, validator=_positive)
    workers: int = attrs.field(default=20, validator=_positive)
    flow: FlowLimits = attrs.field(factory=FlowLimits)
    suspend_s: float = attrs.field(default=1.0, validator=_positive)
    retry_delay_s: float = attrs.field(default=1.0, validator=_positive)
    retry_delay_max_s: float = attrs.field(default=60.0, validator=_positive)
    max_reconsume_times: int = attrs.field(default=16, validator=_positive)
    offset_dir: str = "~/.rocketmq_offsets"
    long_poll_s: float = attrs.field(default=15.0, validator=_positive)
    rebalance_s: float = attrs.field(default=20.0, validator=_positive)
    persist_s: float = attrs.field(default=5.0, validator=_positive)
    lock_renew_s: float = attrs.field(default=20.0, validator=_positive)
    shutdown_wait_s: float = attrs.field(default=10.0, validator=_positive)

    @property
    def clustering(self) -> bool:
        return self.model == CLUSTERING

    @property
    def consume_from_name(self) -> str:
        key = self.consume_from if isinstance(self.consume_from, str) else "timestamp"
        return CONSUME_FROM_NAMES[key]

    def retry_delay(self, attempts: int) -> float:
        """The pause before local retry number `attempts` + 1."""
        return min(self.retry_delay_s * 2 ** min(attempts, 30), self.retry_delay_max_s)
