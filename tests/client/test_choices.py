"""How a producer chooses: validation before sending, the hash selector, the fault tracker
and the round robin that consults it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client import AsyncProducer, Producer, limits
from client.errors import InvalidMessage
from client.fault import FaultTracker, avoid_for_s
from client.message import Message, MessageQueue
from client.selectors import RoundRobin, hash_selector
from client.validation import check_group, check_message, check_messages


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def queues(*groups: str, per_group: int = 2) -> list[MessageQueue]:
    return [MessageQueue("T", g, i) for g in groups for i in range(per_group)]


class TestValidation:
    @pytest.mark.parametrize(
        ("topic", "reason"),
        [
            ("", "blank"),
            ("   ", "blank"),
            ("a b", "characters other than"),
            ("topic/1", "characters other than"),
            ("x" * 128, "128 characters, over 127"),
            ("TBW102", "template"),
        ],
    )
    def test_bad_topics_are_refused(self, topic: str, reason: str) -> None:
        """RocketMQ's topic rules, each failure naming the rule."""
        with pytest.raises(InvalidMessage, match=reason) as info:
            check_message(Message(topic, b"x"))
        assert info.value.field == "topic"

    @pytest.mark.parametrize("topic", ["a", "%RETRY%g", "A-b_c|d", "x" * 127])
    def test_good_topics_pass(self, topic: str) -> None:
        """Letters, digits and %|_- up to 127 characters."""
        check_message(Message(topic, b"x"))

    def test_an_empty_body_is_refused(self) -> None:
        """As Validators.checkMessage: a body of length zero."""
        with pytest.raises(InvalidMessage, match="invalid body: the message body is empty"):
            check_message(Message("T", b""))

    def test_a_body_over_four_mib_is_refused(self) -> None:
        """4 MiB is allowed, one byte more is not; the text gives both sizes."""
        check_message(Message("T", b"x" * limits.MESSAGE_BODY_BYTES_MAX))
        with pytest.raises(InvalidMessage, match="4194305 bytes, over the 4194304 byte"):
            check_message(Message("T", b"x" * (limits.MESSAGE_BODY_BYTES_MAX + 1)))

    def test_a_bad_delay_level_is_refused(self) -> None:
        with pytest.raises(InvalidMessage, match="delay_level"):
            check_message(Message("T", b"x", delay_level=19))

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.builds(
                Message,
                st.sampled_from(["T", "U", "TBW102", "a b"]),
                st.sampled_from([b"x", b"", b"body"]),
                delay_level=st.sampled_from([0, 0, 3, 18, 19, -1]),
            ),
            max_size=6,
        )
    )
    def test_a_batch_is_checked_as_its_messages_are(self, messages: list[Message]) -> None:
        """check_messages refuses a batch exactly when check_message refuses one of its
        messages, with the first such message's error."""
        first_error = None
        for message in messages:
            try:
                check_message(message)
            except InvalidMessage as err:
                first_error = str(err)
                break
        if first_error is None:
            check_messages(messages)
        else:
            with pytest.raises(InvalidMessage) as info:
                check_messages(messages)
            assert str(info.value) == first_error

    def test_producer_settings(self) -> None:
        """A producer refuses bad settings when made, not at its first send."""
        with pytest.raises(InvalidMessage, match="namesrv"):
            AsyncProducer("pg", "")
        with pytest.raises(InvalidMessage, match="retry_times"):
            Producer("pg", "127.0.0.1:9876", retry_times=-1)
        with pytest.raises(InvalidMessage, match="send_timeout"):
            AsyncProducer("pg", send_timeout=0)
        with pytest.raises(InvalidMessage, match="producer group"):
            Producer("bad group")

    def test_group_names(self) -> None:
        """A producer group follows the topic's characters, up to 255."""
        check_group("pg_1")
        for bad in ("", "a b", "g" * 256):
            with pytest.raises(InvalidMessage, match="producer group"):
                check_group(bad)


class TestHashSelector:
    def test_same_key_same_queue_and_a_known_value(self) -> None:
        """queues[crc32(str(arg)) % n]: the documented formula."""
        qs = queues("broker-a", "broker-b", per_group=4)
        message = Message("T", b"x")
        for key in ["order-1", 42, ("a", 1)]:
            expected = qs[zlib.crc32(str(key).encode()) % len(qs)]
            assert hash_selector(qs, message, key) == expected
            assert hash_selector(qs, Message("T", b"other"), key) == expected
        assert zlib.crc32(b"order-1") % 8 == 7  # pinned: a change here moves every key
        assert hash_selector(qs, message, "order-1") == MessageQueue("T", "broker-b", 3)

    def test_stable_across_processes(self) -> None:
        """Another interpreter with another hash seed picks the same queues."""
        code = (
            "from client.message import Message, MessageQueue\n"
            "from client.selectors import hash_selector\n"
            "qs = [MessageQueue('T', g, i) for g in ('a', 'b') for i in range(4)]\n"
            "print([hash_selector(qs, Message('T', b'x'), f'key-{k}').queue_id for k in range(50)])\n"
        )
        env = dict(os.environ, PYTHONHASHSEED="12345")
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
        qs = queues("a", "b", per_group=4)
        here = [hash_selector(qs, Message("T", b"x"), f"key-{k}").queue_id for k in range(50)]
        assert out.strip() == str(here)


class TestFaultTracker:
    def test_latency_steps(self) -> None:
        """At least LATENCY_STEPS_S[i] means AVOID_STEPS_S[i]; below the first, nothing."""
        assert avoid_for_s(0.01) == 0.0
        assert avoid_for_s(0.2) == 0.0
        assert avoid_for_s(0.55) == 1.0
        assert avoid_for_s(2.5) == 4.0
        assert avoid_for_s(100.0) == limits.AVOID_STEPS_S[-1]

    def test_a_failure_is_avoided_for_a_while_and_a_quick_answer_ends_it(self) -> None:
        clock = Clock()
        tracker = FaultTracker(clock)
        tracker.failed("broker-a")
        assert not tracker.available("broker-a")
        assert tracker.available("broker-b")
        clock.now += limits.FAILURE_AVOID_S
        assert tracker.available("broker-a")
        tracker.answered("broker-a", 0.6)  # slow: avoided 1 s
        assert not tracker.available("broker-a")
        tracker.answered("broker-a", 0.001)
        assert tracker.available("broker-a")

    def test_failed_replicas_go_last_until_their_avoidance_ends_or_they_answer(self) -> None:
        """Route order (master first) but the failed addresses last, the one failed first
        before the other; an answer or ADDRESS_AVOID_S gives an address its place back."""
        clock = Clock()
        tracker = FaultTracker(clock)
        route = ["m:1", "s:2", "s:3"]
        tracker.address_failed("m:1")
        clock.now += 1
        tracker.address_failed("s:2")
        assert tracker.replica_order(route) == ["s:3", "m:1", "s:2"]
        tracker.address_answered("s:2")
        assert tracker.replica_order(route) == ["s:2", "s:3", "m:1"]
        clock.now += limits.ADDRESS_AVOID_S
        assert tracker.replica_order(route) == route

    def test_when_every_replica_failed_those_that_answered_come_before_a_silent_one(
        self,
    ) -> None:
        """Found by the third broker soak (partition-leader, 2.2 s to the first SEND_OK): the
        master, cut off from its peers, timed out; the two others answered that they had no
        leader yet; the next try began with the master again, failed first, and waited out a
        doubled request wait before the replica that would have forwarded to the new leader."""
        clock = Clock()
        tracker = FaultTracker(clock)
        route = ["m:1", "s:2", "s:3"]
        tracker.address_failed("m:1", answered=False)  # no answer in 0.5 s
        clock.now += 0.001
        tracker.address_failed("s:2")  # "n1 has known no leader for 0.1 s"
        tracker.address_failed("s:3")
        assert tracker.replica_order(route) == ["s:2", "s:3", "m:1"]
        clock.now += limits.ADDRESS_AVOID_S
        assert tracker.replica_order(route) == ["s:2", "s:3", "m:1"]
        clock.now += limits.ADDRESS_SILENT_AVOID_S - limits.ADDRESS_AVOID_S
        assert tracker.replica_order(route) == route

    def test_the_slowest_recent_answer_halves_every_half_life(self) -> None:
        clock = Clock()
        tracker = FaultTracker(clock)
        assert tracker.slow_answer_s("broker-a") == 0.0
        tracker.answered("broker-a", 0.8)
        tracker.answered("broker-a", 0.1)  # a quicker answer does not hide the slow one
        assert tracker.slow_answer_s("broker-a") == pytest.approx(0.8)
        clock.now += limits.LATENCY_HALF_LIFE_S
        assert tracker.slow_answer_s("broker-a") == pytest.approx(0.4)
        tracker.answered("broker-a", 0.5)
        assert tracker.slow_answer_s("broker-a") == pytest.approx(0.5)
        assert tracker.slow_answer_s("broker-b") == 0.0

    def test_least_avoided_is_the_one_free_first(self) -> None:
        clock = Clock()
        tracker = FaultTracker(clock)
        tracker.failed("broker-a")
        clock.now += 1
        tracker.failed("broker-b")
        assert tracker.least_avoided(["broker-b", "broker-a"]) == "broker-a"
        assert tracker.least_avoided(["broker-b", "broker-c"]) == "broker-c"


class TestRoundRobin:
    def test_every_queue_in_turn(self) -> None:
        """With nothing avoided, n picks visit n different queues."""
        qs = queues("broker-a", "broker-b")
        rr = RoundRobin(random.Random(1))
        tracker = FaultTracker(Clock())
        assert sorted(rr.pick(qs, tracker, ()) for _ in qs) == qs

    def test_avoided_groups_are_skipped_while_another_is_left(self) -> None:
        qs = queues("broker-a", "broker-b")
        rr = RoundRobin(random.Random(1))
        clock = Clock()
        tracker = FaultTracker(clock)
        tracker.failed("broker-a")
        assert {rr.pick(qs, tracker, ()).broker_name for _ in range(10)} == {"broker-b"}
        clock.now += 1
        tracker.failed("broker-b")  # all avoided: the one free first
        assert {rr.pick(qs, tracker, ()).broker_name for _ in range(10)} == {"broker-a"}

    def test_a_retry_goes_to_a_group_not_tried_even_if_avoided(self) -> None:
        """Another broker group when there is one; the same group when there is not."""
        qs = queues("broker-a", "broker-b")
        rr = RoundRobin(random.Random(1))
        tracker = FaultTracker(Clock())
        tracker.failed("broker-b")
        for _ in range(5):
            assert rr.pick(qs, tracker, ["broker-a"]).broker_name == "broker-b"
        assert rr.pick(qs, tracker, ["broker-a", "broker-b"]).broker_name == "broker-a"
        only_a = queues("broker-a")
        assert rr.pick(only_a, tracker, ["broker-a"]).broker_name == "broker-a"
