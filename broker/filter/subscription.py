"""What a subscription lets through, compiled once per (expressionType, expression).

A TAG subscription (`*`, `TagA || TagB`) becomes the set of tag hash codes the ConsumeQueue
is filtered by; an SQL92 one becomes a predicate over the stored message's properties. Heartbeats
and pulls carry the same few expressions again and again, so compiled filters are kept in a
bounded LRU keyed by the text: a subscription is parsed once, whatever number of members and
pulls use it. A bad expression raises a FilterError (FilterSyntaxError with its position,
UnknownExpressionType, FilterTooLarge), every time it is asked for.
"""

from __future__ import annotations

import functools

import attrs

from broker.filter.compiler import Predicate, compile_condition
from broker.filter.errors import FilterTooLarge, UnknownExpressionType
from broker.filter.parser import parse
from remoting.tag_hash import tags_code

TAG, SQL92 = "TAG", "SQL92"  # RocketMQ's ExpressionType; null or "" mean TAG

EXPRESSION_CHARS_MAX = 16 * 1024  # an SQL92 text; real ones are a few dozen characters
FILTER_CACHE_ENTRIES_MAX = 1024  # distinct (type, expression) kept compiled


@attrs.frozen
class SubscriptionFilter:
    """A compiled subscription. Exactly one of `tag_codes` (TAG with tags) and `predicate`
    (SQL92) is set, or neither (TAG `*`: everything)."""

    expression_type: str
    expression: str
    tags: frozenset[str] = frozenset()  # TAG: the tags named; empty for "*"
    tag_codes: frozenset[int] | None = None  # TAG: their hash codes; None: every tag
    predicate: Predicate | None = attrs.field(default=None, eq=False)  # SQL92

    @property
    def by_properties(self) -> bool:
        """Whether matching needs the stored message (SQL92), not just the ConsumeQueue."""
        return self.predicate is not None


EVERYTHING = SubscriptionFilter(TAG, "*")


def parse_tags(expression: str | None) -> frozenset[str]:
    """Tags of a TAG subscription ("TagA || TagB"); empty for "*" or none."""
    if not expression or expression.strip() in ("*", ""):
        return frozenset()
    return frozenset(t.strip() for t in expression.split("||") if t.strip())


def expression_type_of(raw: str | None) -> str:
    """RocketMQ's ExpressionType.isTagType: missing or empty is TAG; else the name as sent."""
    return raw if raw else TAG


@functools.lru_cache(maxsize=FILTER_CACHE_ENTRIES_MAX)
def compile_subscription(expression_type: str | None, expression: str | None) -> SubscriptionFilter:
    """The filter of one subscription; raises a FilterError for a bad one."""
    kind = expression_type_of(expression_type)
    text = expression or ""
    if kind == TAG:
        tags = parse_tags(text)
        codes = frozenset(tags_code(tag) for tag in tags) if tags else None
        return SubscriptionFilter(TAG, text or "*", tags, codes)
    if kind != SQL92:
        raise UnknownExpressionType(kind)
    if len(text) > EXPRESSION_CHARS_MAX:
        raise FilterTooLarge(len(text), EXPRESSION_CHARS_MAX)
    return SubscriptionFilter(SQL92, text, predicate=compile_condition(parse(text)))
