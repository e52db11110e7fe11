"""Delayed and timed messages, the pure half: delay levels, due times, and the rewrites of a
message into the schedule topics and back out of them (docs/protocol.md#delayed-messages).

A message with a delay is not stored in its topic. Whoever builds its record (the replica a
send or a send-back reached) stores it in a schedule queue instead, with its real topic and
queue in REAL_TOPIC / REAL_QID and its due time, in ms of the wall clock, in TIMER_OUT_MS:

- a delay level (property DELAY, 1..len(levels); above the last level means the last, as
  RocketMQ clamps it) goes to SCHEDULE_TOPIC_XXXX, queue level - 1, due at store time plus the
  level's delay (`messageDelayLevel`, "1s 5s 10s ... 2h");
- a delivery time (TIMER_DELIVER_MS or Aliyun's __STARTDELIVERTIME, absolute ms; or
  TIMER_DELAY_SEC / TIMER_DELAY_MS, relative, as RocketMQ 5) goes to rmq_sys_wheel_timer,
  queue 0, when it lies in the future and at most `timerMaxDelaySec` ahead. A level wins over
  a delivery time (RocketMQ 5 drops the timer properties then).

The due time is written into the record rather than recomputed from the level by each
replica, so every replica's ConsumeQueue holds the same tag hash (the due time, as RocketMQ's
SCHEDULE_TOPIC_XXXX units do) whatever its own `messageDelayLevel`. The leader delivers a due
message by proposing a copy in its real topic that names its source in SCHEDULE_SOURCE; the
apply of that copy is what marks the source delivered (broker/schedule_progress.py,
docs/decisions.md "Delayed messages are delivered exactly once across a failover").
"""

from __future__ import annotations

import re

import attrs

from remoting import properties as props

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # RocketMQ's, one queue per level
TIMER_TOPIC = "rmq_sys_wheel_timer"  # RocketMQ 5's timer topic; one queue here
TIMER_QUEUE_ID = 0
SCHEDULE_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC})

DELAY = props.DELAY
DUE = "TIMER_OUT_MS"  # the due time in a schedule record (RocketMQ 5 names its timer's so)
SOURCE = "SCHEDULE_SOURCE"  # "topic:queue_id:queue_offset" of the schedule record delivered
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # absolute ms (RocketMQ 5)
START_DELIVER_TIME = "__STARTDELIVERTIME"  # absolute ms (Aliyun ONS / RocketMQ 4 commercial)
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"  # relative seconds (RocketMQ 5)
TIMER_DELAY_MS = "TIMER_DELAY_MS"  # relative ms (RocketMQ 5)
TIMER_PROPERTIES = (TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_DELIVER_MS, START_DELIVER_TIME)

SOURCE_BYTES = SOURCE.encode()
# a send's properties need a closer look only if one of these occurs in them (one scan for all)
DELAY_MARKERS = (b"DELAY", b"TIMER_", b"STARTDELIVERTIME", SOURCE_BYTES)
_ANY_DELAY_MARKER = re.compile(b"|".join(map(re.escape, DELAY_MARKERS)))

DEFAULT_LEVELS_TEXT = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
LEVELS_MAX = 64  # queues of SCHEDULE_TOPIC_XXXX; RocketMQ ships 18
LEVEL_MS_MAX = 7 * 86_400_000  # a level past a week outlives the log's default retention
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
LEVEL = re.compile(r"^([0-9]{1,9})(ms|s|m|h|d)$")
TIMER_MAX_DELAY_SEC_DEFAULT = 3 * 86_400  # RocketMQ 5's timerMaxDelaySec
RETRY_LEVEL_BASE = 3  # a send-back without a level waits level 3 + reconsumeTimes (RocketMQ)


class DelayIllegal(ValueError):
    """A message's delay properties cannot be honoured (answered MESSAGE_ILLEGAL)."""


def parse_levels(text: str) -> tuple[int, ...]:
    """`messageDelayLevel` ("1s 5s 10s ... 2h") as each level's delay in ms. RocketMQ's units
    s, m, h, d, and ms (ours, for tests). Raises ValueError naming the bad part."""
    parts = text.split()
    if not parts:
        raise ValueError("no delay levels")
    if len(parts) > LEVELS_MAX:
        raise ValueError(f"{len(parts)} delay levels; at most {LEVELS_MAX}")
    levels = []
    for part in parts:
        match = LEVEL.match(part)
        if match is None:
            raise ValueError(f"{part!r} is not a number and a unit (ms, s, m, h, d)")
        ms = int(match[1]) * UNIT_MS[match[2]]
        if not 0 < ms <= LEVEL_MS_MAX:
            raise ValueError(f"{part!r} is not between 1ms and 7d")
        levels.append(ms)
    return tuple(levels)


def format_levels(levels: tuple[int, ...]) -> str:
    """The text `parse_levels` reads back: each delay in the largest unit that divides it."""
    out = []
    for ms in levels:
        unit = next(u for u in ("d", "h", "m", "s", "ms") if ms % UNIT_MS[u] == 0)
        out.append(f"{ms // UNIT_MS[unit]}{unit}")
    return " ".join(out)


@attrs.frozen
class Delay:
    """Where a delayed message waits and when it is due."""

    topic: str  # SCHEDULE_TOPIC or TIMER_TOPIC
    queue_id: int
    due_ms: int
    level: int  # 0 for a delivery time


def level_delay(level: int, now_ms: int, levels: tuple[int, ...]) -> Delay:
    """A level's schedule queue and due time (a level past the last is the last)."""
    assert level > 0, level
    level = min(level, len(levels))
    return Delay(SCHEDULE_TOPIC, level - 1, now_ms + levels[level - 1], level)


def delay_of(properties: dict[str, str], now_ms: int, levels: tuple[int, ...],
             timer_max_ms: int) -> Delay | None:  # fmt: skip
    """The delay a sent message asks for, or None to store it in its topic now.
    Raises DelayIllegal for a value that is not a number or a time too far ahead."""
    text = properties.get(DELAY)
    if text is not None:
        try:
            level = int(text)
        except ValueError:
            raise DelayIllegal(f"the delay level DELAY={text!r} is not a number") from None
        if level > 0:
            return level_delay(level, now_ms, levels)
    due = _timer_due(properties, now_ms)
    if due is None or due <= now_ms:
        return None  # RocketMQ 5: a time already past is an ordinary message
    if due - now_ms > timer_max_ms:
        raise DelayIllegal(
            f"timer message illegal, the delay time should not be bigger than the max delay "
            f"{timer_max_ms}ms (it is {due - now_ms}ms)"
        )
    return Delay(TIMER_TOPIC, TIMER_QUEUE_ID, due, 0)


def _timer_due(properties: dict[str, str], now_ms: int) -> int | None:
    for key in TIMER_PROPERTIES:
        text = properties.get(key)
        if text is None:
            continue
        try:
            value = int(text)
        except ValueError:
            raise DelayIllegal(f"timer message illegal: {key}={text!r} is not a number") from None
        if key == TIMER_DELAY_SEC:
            return now_ms + value * 1000
        if key == TIMER_DELAY_MS:
            return now_ms + value
        return value
    return None


def scheduled_properties(
    properties: dict[str, str], real_topic: str, real_queue_id: int, delay: Delay
) -> dict[str, str]:
    """A delayed message's properties as its schedule record holds them."""
    out = {k: v for k, v in properties.items() if k != SOURCE}
    if delay.level:  # RocketMQ 5: a level wins, the timer properties go
        for key in TIMER_PROPERTIES:
            out.pop(key, None)
        out[DELAY] = str(delay.level)
    out[props.REAL_TOPIC] = real_topic
    out[props.REAL_QID] = str(real_queue_id)
    out[DUE] = str(delay.due_ms)
    return out


@attrs.frozen
class Target:
    """Where a due schedule record goes."""

    topic: str
    queue_id: int
    properties: dict[str, str]


def delivered(properties: dict[str, str], source: Source) -> Target | None:
    """The message a due schedule record becomes in its real topic: DELAY and the due time
    dropped, REAL_TOPIC / REAL_QID kept (as RocketMQ keeps them), its source named. None when
    the record names no real topic or queue (nothing to deliver)."""
    topic = properties.get(props.REAL_TOPIC)
    queue_text = properties.get(props.REAL_QID, "")
    if not topic or topic in SCHEDULE_TOPICS or not queue_text.isdigit():
        return None
    out = {k: v for k, v in properties.items() if k not in (DELAY, DUE)}
    out[SOURCE] = source.text()
    return Target(topic, int(queue_text), out)


def rolled(properties: dict[str, str], source: Source) -> Target:
    """A schedule record (a timer record, or a level record waiting longer than the roll age)
    copied to the tail of the timer queue, same due time, naming its source."""
    return Target(TIMER_TOPIC, TIMER_QUEUE_ID, {**properties, SOURCE: source.text()})


@attrs.frozen(order=True)
class Source:
    """A schedule record: (topic, queue id, queue offset)."""

    topic: str
    queue_id: int
    queue_offset: int

    def text(self) -> str:
        return f"{self.topic}:{self.queue_id}:{self.queue_offset}"

    @classmethod
    def parse(cls, raw: bytes | str) -> Source | None:
        """The source a SCHEDULE_SOURCE value names, or None when it names no schedule queue."""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        topic, _, rest = text.partition(":")
        queue_text, _, offset_text = rest.partition(":")
        if topic not in SCHEDULE_TOPICS or not queue_text.isdigit() or not offset_text.isdigit():
            return None
        return cls(topic, int(queue_text), int(offset_text))


def due_of(properties_data: bytes) -> int:
    """The ConsumeQueue tag hash of a schedule record: its due time (0, due at once, when the
    record carries none)."""
    raw = props.find(properties_data, DUE.encode())
    if raw is None or not raw.isdigit() or len(raw) > 18:
        return 0
    return int(raw)


def needs_look(properties_data: bytes) -> bool:
    """Whether a sent message's properties may ask for a delay or carry a SOURCE to strip."""
    return _ANY_DELAY_MARKER.search(properties_data) is not None
