"""What a producer checks before anything goes on the wire, as RocketMQ's Validators does.

A topic is 1..127 characters of [%|a-zA-Z0-9_-] and not the auto-creation template TBW102; a
body is not empty and at most 4 MiB (before compression); a producer group is 1..255 of the same
characters. Each failure is an InvalidMessage naming the field and the rule it broke.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from operator import attrgetter

from client import limits
from client.errors import InvalidMessage
from client.message import Message

NAME_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # Validators.VALID_PATTERN_STR


def check_topic(topic: str) -> None:
    # every send checks its topic, and most applications send to a few: remember the good ones
    if type(topic) is str and topic in _TOPICS_SEEN:
        return
    _check_topic(topic)
    if len(_TOPICS_SEEN) >= TOPICS_SEEN_MAX:
        _TOPICS_SEEN.clear()
    _TOPICS_SEEN.add(topic)


TOPICS_SEEN_MAX = 1024
_TOPICS_SEEN: set[str] = set()


def _check_topic(topic: str) -> None:
    if not isinstance(topic, str) or not topic.strip():
        raise InvalidMessage("topic", "the topic is blank")
    if len(topic) > limits.TOPIC_CHARS_MAX:
        raise InvalidMessage(
            "topic", f"{topic[:40]!r}... is {len(topic)} characters, over {limits.TOPIC_CHARS_MAX}"
        )
    if not NAME_PATTERN.fullmatch(topic):
        raise InvalidMessage(
            "topic", f"{topic!r} has characters other than letters, digits and %|_-"
        )
    if topic == limits.DEFAULT_TOPIC:
        raise InvalidMessage(
            "topic", f"{topic!r} is the template new topics are created from; send to another"
        )


def check_group(group: str) -> None:
    if not isinstance(group, str) or not group.strip():
        raise InvalidMessage("producer group", "the group is blank")
    if len(group) > limits.GROUP_CHARS_MAX:
        raise InvalidMessage(
            "producer group", f"{len(group)} characters, over {limits.GROUP_CHARS_MAX}"
        )
    if not NAME_PATTERN.fullmatch(group):
        raise InvalidMessage(
            "producer group", f"{group!r} has characters other than letters, digits and %|_-"
        )


def check_message(message: Message) -> None:
    """Raise InvalidMessage unless `message` may be sent."""
    if not isinstance(message, Message):
        raise InvalidMessage("message", f"a {type(message).__name__}, not a client.Message")
    check_topic(message.topic)
    if not message.body:
        raise InvalidMessage("body", "the message body is empty")
    if len(message.body) > limits.MESSAGE_BODY_BYTES_MAX:
        raise InvalidMessage(
            "body",
            f"{len(message.body)} bytes, over the {limits.MESSAGE_BODY_BYTES_MAX} byte "
            "(4 MiB) limit of one message",
        )
    if not 0 <= message.delay_level <= limits.DELAY_LEVEL_MAX:
        raise InvalidMessage(
            "delay_level", f"{message.delay_level}, not one of 0..{limits.DELAY_LEVEL_MAX}"
        )


_DELAY_LEVELS = frozenset(range(limits.DELAY_LEVEL_MAX + 1))
_TOPIC, _BODY, _DELAY = attrgetter("topic"), attrgetter("body"), attrgetter("delay_level")


def check_messages(messages: Sequence[Message]) -> None:
    """check_message for each of `messages` (a batch): the checks run column by column in
    C-level steps, and one by one only to name the first message that fails."""
    if set(map(type, messages)) != {Message}:  # something else, or a subclass: one by one
        for message in messages:
            check_message(message)
        return
    lengths = list(map(len, map(_BODY, messages)))
    if (
        min(lengths) == 0
        or max(lengths) > limits.MESSAGE_BODY_BYTES_MAX
        or not set(map(_DELAY, messages)) <= _DELAY_LEVELS
        or not all(map(_topic_ok, set(map(_TOPIC, messages))))
    ):
        for message in messages:
            check_message(message)


def _topic_ok(topic: str) -> bool:
    try:
        check_topic(topic)
    except InvalidMessage:
        return False
    return True
