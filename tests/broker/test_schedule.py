"""Delayed and timed messages (broker/delays.py, broker/schedule_progress.py, broker/schedule.py):
the pure parts with literal inputs, then sends against one in-process group on 127.0.0.1
(tests/broker/group.py) with levels shortened by configuration.

The failover cases run on memory streams under the mock clock (test_schedule_failover.py), and
against real processes (test_schedule_cluster.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from broker import delays
from broker.delays import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    Delay,
    DelayIllegal,
    Source,
    delay_of,
    format_levels,
    parse_levels,
)
from broker.entries import EntryType, decode_meta, entry_type, void_entry
from broker.metadata import Metadata
from broker.schedule_progress import DeliveryProgress, QueueProgress
from remoting import properties as props
from remoting.client import open_connection
from remoting.codes import ResponseCode
from remoting.connection import Connection
from remoting.stored_message import StoredMessage
from tests.broker import rmq
from tests.broker.group import Group, broker_group

LEVELS = parse_levels(delays.DEFAULT_LEVELS_TEXT)
NOW = 1_764_000_000_000
DAY_MS = 86_400_000

# --- levels -----------------------------------------------------------------------------------


def test_default_levels_are_rocketmqs() -> None:
    assert LEVELS == (
        1000, 5000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
        420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
    )  # fmt: skip
    assert format_levels(LEVELS) == delays.DEFAULT_LEVELS_TEXT


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        ("1s", (1000,)),
        ("  2m   1h\t3d ", (120_000, 3_600_000, 3 * DAY_MS)),
        ("250ms 1000ms 60s", (250, 1000, 60_000)),
    ],
)
def test_levels_parse_with_rocketmqs_units_and_ms(text: str, levels: tuple[int, ...]) -> None:
    assert parse_levels(text) == levels


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no delay levels"),
        ("1s 5x", "'5x' is not a number and a unit"),
        ("1.5s", "'1.5s' is not a number and a unit"),
        ("s", "'s' is not a number and a unit"),
        ("0s", "'0s' is not between 1ms and 7d"),
        ("8d", "'8d' is not between 1ms and 7d"),
        (" ".join(["1s"] * 65), "65 delay levels; at most 64"),
    ],
)
def test_bad_levels_are_named(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_levels(text)


@given(st.lists(st.integers(1, 7 * DAY_MS), min_size=1, max_size=64))
def test_levels_format_and_parse_back(levels: list[int]) -> None:
    assert parse_levels(format_levels(tuple(levels))) == tuple(levels)


# --- what a send asks for ------------------------------------------------------------------------


def ask(properties: dict[str, str], max_ms: int = 3 * DAY_MS) -> Delay | None:
    return delay_of(properties, NOW, LEVELS, max_ms)


def test_a_level_goes_to_its_schedule_queue_due_after_its_delay() -> None:
    assert ask({"DELAY": "3"}) == Delay(SCHEDULE_TOPIC, 2, NOW + 10_000, 3)
    assert ask({"DELAY": "1"}) == Delay(SCHEDULE_TOPIC, 0, NOW + 1000, 1)
    # past the last level: the last (RocketMQ clamps it)
    assert ask({"DELAY": "99"}) == Delay(SCHEDULE_TOPIC, 17, NOW + 7_200_000, 18)


@pytest.mark.parametrize("level", ["0", "-1"])
def test_a_level_of_zero_or_less_is_no_delay(level: str) -> None:
    assert ask({"DELAY": level}) is None


def test_delivery_times_absolute_and_relative() -> None:
    due = Delay(TIMER_TOPIC, 0, NOW + 1234, 0)
    assert ask({"TIMER_DELIVER_MS": str(NOW + 1234)}) == due
    assert ask({"__STARTDELIVERTIME": str(NOW + 1234)}) == due
    assert ask({"TIMER_DELAY_MS": "1234"}) == due
    assert ask({"TIMER_DELAY_SEC": "2"}) == Delay(TIMER_TOPIC, 0, NOW + 2000, 0)


def test_a_delivery_time_already_past_is_an_ordinary_message() -> None:
    assert ask({"TIMER_DELIVER_MS": str(NOW)}) is None
    assert ask({"TIMER_DELIVER_MS": str(NOW - 5000)}) is None


def test_a_level_wins_over_a_delivery_time() -> None:
    properties = {"DELAY": "2", "TIMER_DELIVER_MS": str(NOW + 99_000), "KEYS": "k"}
    delay = ask(properties)
    assert delay == Delay(SCHEDULE_TOPIC, 1, NOW + 5000, 2)
    stored = delays.scheduled_properties(properties, "T", 3, delay)
    assert stored == {
        "DELAY": "2",
        "KEYS": "k",
        "REAL_TOPIC": "T",
        "REAL_QID": "3",
        "TIMER_OUT_MS": str(NOW + 5000),
    }


@pytest.mark.parametrize(
    ("properties", "why"),
    [
        ({"DELAY": "x"}, "DELAY='x' is not a number"),
        ({"TIMER_DELIVER_MS": "soon"}, "TIMER_DELIVER_MS='soon' is not a number"),
        ({"TIMER_DELAY_SEC": str(3 * 86_400 + 1)}, "bigger than the max delay 259200000ms"),
        ({"TIMER_DELIVER_MS": str(NOW + 3 * DAY_MS + 1)}, "bigger than the max delay"),
    ],
)
def test_illegal_delays_are_refused(properties: dict[str, str], why: str) -> None:
    with pytest.raises(DelayIllegal, match=why):
        ask(properties)
    assert ask({"TIMER_DELIVER_MS": str(NOW + 3 * DAY_MS)}) is not None  # the maximum itself


def test_a_due_record_is_delivered_to_its_real_topic_naming_its_source() -> None:
    stored = {"DELAY": "2", "REAL_TOPIC": "T", "REAL_QID": "3", "TIMER_OUT_MS": "9", "K": "v"}
    source = Source(SCHEDULE_TOPIC, 1, 42)
    target = delays.delivered(stored, source)
    assert target == delays.Target(
        "T", 3, {"REAL_TOPIC": "T", "REAL_QID": "3", "K": "v", "SCHEDULE_SOURCE": source.text()}
    )
    assert delays.delivered({"REAL_QID": "3"}, source) is None
    assert delays.delivered({"REAL_TOPIC": "T", "REAL_QID": "x"}, source) is None
    assert delays.delivered({"REAL_TOPIC": SCHEDULE_TOPIC, "REAL_QID": "1"}, source) is None
    rolled = delays.rolled(stored, Source(TIMER_TOPIC, 0, 7))
    assert rolled.topic == TIMER_TOPIC and rolled.properties["TIMER_OUT_MS"] == "9"
    assert rolled.properties["SCHEDULE_SOURCE"] == f"{TIMER_TOPIC}:0:7"


@pytest.mark.parametrize(
    ("text", "source"),
    [
        ("SCHEDULE_TOPIC_XXXX:2:17", Source(SCHEDULE_TOPIC, 2, 17)),
        (b"rmq_sys_wheel_timer:0:0", Source(TIMER_TOPIC, 0, 0)),
        ("OtherTopic:1:2", None),
        ("SCHEDULE_TOPIC_XXXX:2", None),
        ("SCHEDULE_TOPIC_XXXX:-1:2", None),
        ("SCHEDULE_TOPIC_XXXX:1:2x", None),
    ],
)
def test_sources_parse(text: str | bytes, source: Source | None) -> None:
    assert Source.parse(text) == source


def test_due_time_of_a_record_is_its_tag_hash() -> None:
    assert delays.due_of(props.encode({"TIMER_OUT_MS": "1764000000123"})) == 1764000000123
    assert delays.due_of(props.encode({"KEYS": "k"})) == 0
    assert delays.due_of(props.encode({"TIMER_OUT_MS": "-5"})) == 0


# --- delivery progress -----------------------------------------------------------------------------


def test_progress_marks_in_and_out_of_order_and_skips() -> None:
    p = QueueProgress()
    p.mark(0)
    p.mark(2)
    assert (p.watermark, p.ahead) == (1, {2})
    assert p.delivered(0) and p.delivered(2) and not p.delivered(1)
    p.mark(1)
    assert (p.watermark, p.ahead) == (3, set())
    p.mark(1)  # again: nothing changes
    p.mark(7)
    p.mark(9)
    p.skip_to(8)  # 3..7 are gone: delivered or not, they count as done
    assert (p.watermark, p.ahead) == (8, {9})
    p.skip_to(5)
    assert p.watermark == 8
    p.mark(8)
    assert (p.watermark, p.ahead) == (10, set())


def test_progress_state_round_trips_and_ops_apply() -> None:
    progress = DeliveryProgress()
    progress.apply(DeliveryProgress.delivered_op(Source(SCHEDULE_TOPIC, 1, 0)))
    progress.apply(DeliveryProgress.delivered_op(Source(TIMER_TOPIC, 0, 5)))
    progress.apply(DeliveryProgress.skip_op(SCHEDULE_TOPIC, 4, 30))
    assert progress.delivered(Source(SCHEDULE_TOPIC, 1, 0))
    assert not progress.delivered(Source(SCHEDULE_TOPIC, 1, 1))
    assert progress.delivered(Source(TIMER_TOPIC, 0, 5))
    assert not progress.delivered(Source(TIMER_TOPIC, 0, 4))
    assert progress.delivered(Source(SCHEDULE_TOPIC, 4, 29))
    copy = DeliveryProgress()
    copy.restore(progress.state())
    assert copy.queues == progress.queues


def test_progress_is_metadata_snapshots_and_checkpoints_carry() -> None:
    metadata = Metadata()
    metadata.apply(DeliveryProgress.delivered_op(Source(TIMER_TOPIC, 0, 3)))
    metadata.apply(DeliveryProgress.skip_op(SCHEDULE_TOPIC, 0, 9))
    assert metadata.version == 0  # not topic data: no re-registration
    copy = Metadata()
    copy.restore(metadata.snapshot_op(1, 2)["state"])
    assert copy.schedule.queues == metadata.schedule.queues
    older = Metadata()
    state = metadata.state()
    del state["schedule"]  # a checkpoint written before delays existed
    older.restore(state)
    assert older.schedule.queues == {}


@given(st.integers(23, 300_000))
def test_void_entries_have_any_size_and_change_nothing(size: int) -> None:
    body = void_entry(size)
    assert len(body) == size
    assert entry_type(body) is EntryType.META
    op = decode_meta(body)
    assert op is not None and op["op"] == "void"


# --- sends against an in-process group -------------------------------------------------------------

SHORT_LEVELS = (300, 600, 900)
TOPIC = "Delayed"
WAIT_S = 10.0


def wall_ms() -> int:
    return int(time.time() * 1000)


async def pull_all(conn: Connection, topic: str, queue_id: int) -> list[StoredMessage]:
    response, messages = await rmq.pull(conn, topic, queue_id, 0)
    assert response.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), response.remark
    return messages


async def wait_for(conn: Connection, topic: str, queue_id: int, count: int) -> list[StoredMessage]:
    with trio.fail_after(WAIT_S):
        while True:
            messages = await pull_all(conn, topic, queue_id)
            if len(messages) >= count:
                return messages
            await trio.sleep(0.02)


async def wait_all_delivered(group: Group) -> None:
    """Until the leader has delivered every schedule record and every replica applied it."""
    leader = group.leader()
    state = leader.state
    with trio.fail_after(WAIT_S):
        while True:
            behind = [
                (topic, q)
                for topic, q, _ in state.queues
                if topic in delays.SCHEDULE_TOPICS
                and state.metadata.schedule.of(topic, q).watermark < state.queue_range(topic, q)[1]
            ]
            if not behind:
                break
            await trio.sleep(0.02)
    await group.wait_applied_everywhere()


async def test_delayed_messages_wait_in_the_schedule_queue_then_arrive_once(
    tmp_path: Path,
) -> None:
    async with broker_group(tmp_path, delay_levels=SHORT_LEVELS) as group:
        follower = group.follower()
        async with open_connection("127.0.0.1", follower.config.listen.port) as conn:
            sent = {}
            for level in (1, 2, 3, 7):
                uniq = f"u{level}"
                properties = rmq.properties(DELAY=str(level), UNIQ_KEY=uniq, TAGS="t")
                before = wall_ms()
                response = await rmq.send(conn, TOPIC, 0, b"m%d" % level, props=properties)
                assert response.code == ResponseCode.SUCCESS, response.remark
                sent[uniq] = (level, before)
            assert await pull_all(conn, TOPIC, 0) == []  # invisible in the real topic
            waiting = await wait_for(conn, SCHEDULE_TOPIC, 2, 2)
            assert {m.properties["REAL_TOPIC"] for m in waiting} == {TOPIC}
            assert [m.properties["DELAY"] for m in waiting] == ["3", "3"]  # 7 is clamped to 3
            await wait_for(conn, TOPIC, 0, 4)
            await wait_all_delivered(group)
            arrived = await pull_all(conn, TOPIC, 0)
        schedule_topic = follower.topic(SCHEDULE_TOPIC)
        assert schedule_topic is not None and schedule_topic.queues == 3
    assert sorted(m.properties["UNIQ_KEY"] for m in arrived) == sorted(sent)  # each once
    for message in arrived:
        level, sent_ms = sent[message.properties["UNIQ_KEY"]]
        delay_ms = SHORT_LEVELS[min(level, 3) - 1]
        assert message.store_timestamp_ms >= sent_ms + delay_ms  # never early
        assert message.store_timestamp_ms <= sent_ms + delay_ms + 1000  # within 1 s
        assert "DELAY" not in message.properties and "TIMER_OUT_MS" not in message.properties
        assert message.properties["REAL_TOPIC"] == TOPIC
        assert message.properties["SCHEDULE_SOURCE"].startswith(SCHEDULE_TOPIC + ":")
        assert message.topic == TOPIC and message.queue_id == 0


async def test_timer_messages_arrive_at_their_time_in_due_order(tmp_path: Path) -> None:
    async with (
        broker_group(tmp_path) as group,
        open_connection("127.0.0.1", group.leader().config.listen.port) as conn,
    ):
        now = wall_ms()
        dues = {"late": now + 900, "early": now + 300, "middle": now + 600}
        for name, due in dues.items():
            key = "__STARTDELIVERTIME" if name == "middle" else "TIMER_DELIVER_MS"
            properties = rmq.properties(UNIQ_KEY=name, **{key: str(due)})
            response = await rmq.send(conn, TOPIC, 1, name.encode(), props=properties)
            assert response.code == ResponseCode.SUCCESS, response.remark
        assert await pull_all(conn, TOPIC, 1) == []
        await wait_for(conn, TOPIC, 1, 3)
        await wait_all_delivered(group)
        arrived = await pull_all(conn, TOPIC, 1)
    assert [m.properties["UNIQ_KEY"] for m in arrived] == ["early", "middle", "late"]
    for message in arrived:
        due = dues[message.properties["UNIQ_KEY"]]
        assert due <= message.store_timestamp_ms <= due + 1000


async def test_bad_delays_and_schedule_topics_are_refused(tmp_path: Path) -> None:
    async with (
        broker_group(tmp_path, timer_max_delay_s=60) as group,
        open_connection("127.0.0.1", group.leader().config.listen.port) as conn,
    ):
        cases = [
            (TOPIC, rmq.properties(DELAY="soon"), ResponseCode.MESSAGE_ILLEGAL),
            (TOPIC, rmq.properties(TIMER_DELAY_SEC="61"), ResponseCode.MESSAGE_ILLEGAL),
            (SCHEDULE_TOPIC, rmq.properties(KEYS="k"), ResponseCode.NO_PERMISSION),
            (TIMER_TOPIC, rmq.properties(KEYS="k"), ResponseCode.NO_PERMISSION),
        ]
        for topic, properties, code in cases:
            response = await rmq.send(conn, topic, 0, b"x", props=properties)
            assert response.code == code, (topic, properties, response.remark)
        # a client cannot pass a message off as a delivery: its SCHEDULE_SOURCE goes
        spoof = rmq.properties(UNIQ_KEY="spoof", SCHEDULE_SOURCE=f"{SCHEDULE_TOPIC}:0:0")
        response = await rmq.send(conn, TOPIC, 0, b"x", props=spoof)
        assert response.code == ResponseCode.SUCCESS
        (stored,) = await pull_all(conn, TOPIC, 0)
        leader = group.leader()
        assert not leader.state.metadata.schedule.delivered(Source(SCHEDULE_TOPIC, 0, 0))
    assert "SCHEDULE_SOURCE" not in stored.properties
    assert stored.properties["UNIQ_KEY"] == "spoof"
