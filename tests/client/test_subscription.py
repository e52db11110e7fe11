"""Subscriptions (client/subscription.py), the pull answer as the application sees it
(client/pull_consumer.py, pull_result), and the push consumer's settings (client/push_config.py)."""

from __future__ import annotations

import pytest

from client.consumer_requests import RawPull
from client.message import MessageQueue
from client.pull_consumer import PullStatus, pull_result
from client.push_config import PushConfig
from client.subscription import Subscription, parse_tags
from remoting.codes import ResponseCode
from remoting.tag_hash import tags_code
from tests.client.messages import message

Q = MessageQueue("T", "broker-a", 0)


def test_expressions() -> None:
    assert parse_tags("*") == frozenset() == parse_tags("") == parse_tags(None)
    assert parse_tags(" TagA ||TagB|| ") == {"TagA", "TagB"}
    with pytest.raises(ValueError, match="no tag"):
        parse_tags("||")


def test_matching_is_by_tag_string() -> None:
    every = Subscription.parse("T", "*")
    some = Subscription.parse("T", "TagA || TagB")
    assert every.matches(None) and every.matches("X")
    assert some.matches("TagA") and some.matches("TagB")
    assert not some.matches("TagC") and not some.matches(None)


def test_heartbeat_data_as_java_writes_it() -> None:
    sub = Subscription.parse("T", "TagB || TagA")
    data = sub.heartbeat_data()
    assert data["topic"] == "T" and data["subString"] == "TagB || TagA"
    assert data["tagsSet"] == ["TagA", "TagB"]
    assert data["codeSet"] == sorted([tags_code("TagA"), tags_code("TagB")])
    assert data["subVersion"] == sub.version and data["expressionType"] == "TAG"
    assert Subscription.parse("T").heartbeat_data()["subString"] == "*"


def test_an_sql92_subscription_is_the_brokers_to_filter() -> None:
    sub = Subscription.parse("T", " a BETWEEN 0 AND 3 ", "SQL92")
    assert sub.expression == "a BETWEEN 0 AND 3" and sub.expression_type == "SQL92"
    assert sub.matches("TagA") and sub.matches(None)  # the broker sent only matches
    data = sub.heartbeat_data()
    assert data["expressionType"] == "SQL92" and data["subString"] == "a BETWEEN 0 AND 3"
    assert data["tagsSet"] == [] and data["codeSet"] == []
    with pytest.raises(ValueError, match="needs an expression"):
        Subscription.parse("T", " ", "SQL92")
    with pytest.raises(ValueError, match="expression type 'XPATH'"):
        Subscription.parse("T", "a = 1", "XPATH")


def raw(code: int, tags: list[str | None]) -> RawPull:
    messages = [message(Q, n, tags=t) for n, t in enumerate(tags)]
    return RawPull(code, len(tags), 0, 10, 0, messages, "127.0.0.1:1")


def test_pull_answers_map_to_statuses_after_the_client_filter() -> None:
    sub = Subscription.parse("T", "TagA")
    found = pull_result(raw(ResponseCode.SUCCESS, ["TagA", "TagX", "TagA"]), sub)
    assert found.status is PullStatus.FOUND
    assert [m.queue_offset for m in found.messages] == [0, 2]  # a hash collision dropped
    assert (found.next_begin_offset, found.min_offset, found.max_offset) == (3, 0, 10)
    collided = pull_result(raw(ResponseCode.SUCCESS, ["TagX"]), sub)
    assert collided.status is PullStatus.NO_MATCHED_MSG and collided.next_begin_offset == 1
    for code, status in [
        (ResponseCode.PULL_NOT_FOUND, PullStatus.NO_NEW_MSG),
        (ResponseCode.PULL_RETRY_IMMEDIATELY, PullStatus.NO_MATCHED_MSG),
        (ResponseCode.PULL_OFFSET_MOVED, PullStatus.OFFSET_ILLEGAL),
    ]:
        assert pull_result(raw(code, []), sub).status is status


def test_push_settings_are_checked() -> None:
    assert PushConfig().consume_from_name == "CONSUME_FROM_LAST_OFFSET"
    assert PushConfig(consume_from=("timestamp", 5)).consume_from_name == "CONSUME_FROM_TIMESTAMP"
    with pytest.raises(ValueError, match="consume_from"):
        PushConfig(consume_from="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PushConfig(pull_batch_size=33)
    with pytest.raises(ValueError, match="workers"):
        PushConfig(workers=0)
    with pytest.raises(ValueError):
        PushConfig(model="p2p")
    config = PushConfig(retry_delay_s=1.0, retry_delay_max_s=60.0)
    assert [config.retry_delay(n) for n in (0, 1, 5, 6, 100)] == [1.0, 2.0, 32.0, 60.0, 60.0]
