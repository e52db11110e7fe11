"""A consumer's subscription to one topic: a TAG expression ("*", "TagA", "TagA || TagB"), or
an SQL92 one over the messages' properties and TAGS ("a BETWEEN 0 AND 3 AND TAGS = 'x'";
docs/filtering.md).

The broker filters by tag hash (its ConsumeQueue keeps each message's tag hash code); hashes
collide, so the client filters again by the tag string, as RocketMQ clients do (`matches`).
An SQL92 expression is evaluated by the broker alone, exactly, as RocketMQ's Java client leaves
it; a broker that cannot parse it refuses the pulls (SUBSCRIPTION_PARSE_FAILED, with where).
`heartbeat_data` is the SubscriptionData a HEART_BEAT carries (protocol reference 3.6), with
Java's field names.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from remoting.tag_hash import tags_code

EXPRESSION_ALL = "*"
TAG_SEPARATOR = "||"
TAG, SQL92 = "TAG", "SQL92"  # expressionType, as RocketMQ's ExpressionType
EXPRESSION_TYPES = (TAG, SQL92)


def parse_tags(expression: str | None) -> frozenset[str]:
    """The tags of an expression; empty for "*" (or an empty expression), meaning every tag."""
    if expression is None or expression.strip() in ("", EXPRESSION_ALL):
        return frozenset()
    tags = frozenset(t.strip() for t in expression.split(TAG_SEPARATOR) if t.strip())
    if not tags:
        raise ValueError(f"no tag in the expression {expression!r}")
    return tags


@attrs.frozen
class Subscription:
    topic: str
    expression: str  # "*" or "TagA || TagB", as given (normalised for "*")
    tags: frozenset[str]  # empty: every message
    version: int  # subVersion: ms when subscribed
    expression_type: str = TAG  # or SQL92: then `tags` is empty and the broker alone filters

    @classmethod
    def parse(
        cls, topic: str, expression: str | None = EXPRESSION_ALL, expression_type: str = TAG
    ) -> Subscription:
        """Raises ValueError for no topic, an unknown expression type, an empty SQL92
        expression or a TAG expression of separators only."""
        if not topic:
            raise ValueError("a subscription needs a topic")
        version = int(time.time() * 1000)
        if expression_type == SQL92:
            text = (expression or "").strip()
            if not text:
                raise ValueError("an SQL92 subscription needs an expression")
            return cls(topic, text, frozenset(), version, SQL92)
        if expression_type != TAG:
            raise ValueError(
                f"expression type {expression_type!r} is not one of {EXPRESSION_TYPES}"
            )
        tags = parse_tags(expression)
        text = EXPRESSION_ALL if not tags else str(expression).strip()
        return cls(topic, text, tags, version)

    @property
    def every_tag(self) -> bool:
        return not self.tags

    @property
    def codes(self) -> frozenset[int]:
        """The tag hash codes the broker filters by."""
        return frozenset(tags_code(tag) for tag in self.tags)

    def matches(self, tags: str | None) -> bool:
        """Whether a message with TAGS `tags` belongs to this subscription (no tag: only "*";
        SQL92: every message the broker sent)."""
        return self.every_tag or (tags is not None and tags in self.tags)

    def heartbeat_data(self) -> dict[str, Any]:
        return {
            "classFilterMode": False,
            "topic": self.topic,
            "subString": self.expression,
            "tagsSet": sorted(self.tags),
            "codeSet": sorted(self.codes),
            "subVersion": self.version,
            "expressionType": self.expression_type,
        }
