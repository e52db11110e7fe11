"""Turns a parsed SQL92 filter into a predicate over a message's properties (docs/filtering.md).

Each node becomes a closure of the properties dict, built once per subscription; evaluating
one is a few dict lookups and comparisons, and never raises. Values are None (NULL: a missing
property, or unknown), booleans, numbers and strings; a property's value is always a string.

Three-valued logic (Kleene's, as RocketMQ's LogicExpression): a comparison with a missing
property, or with a value that cannot be read as the other side's type, is UNKNOWN (None);
NOT UNKNOWN is UNKNOWN; FALSE AND UNKNOWN is FALSE; TRUE OR UNKNOWN is TRUE; a message
matches only when the whole condition is TRUE.

Reading a property as the other side's type:
- against a number (or, for < <= > >= BETWEEN, always): a decimal number, `[+-]digits[.digits]
  [e[+-]digits]` (no spaces, no hex, no NaN); "abc" > 3 is UNKNOWN;
- against TRUE/FALSE: 'true' or 'false' in any case; other strings are UNKNOWN;
- against a string: the string itself (equality is exact; "3" = '3.0' is FALSE).
A number and a boolean are never equal (RocketMQ's __compare gives -1 there).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from broker.filter.syntax import (
    And,
    Between,
    Compare,
    Comparison,
    In,
    IsNull,
    Literal,
    Match,
    Node,
    Not,
    Or,
    Property,
    StringMatch,
    Truth,
)

Properties = Mapping[str, str]
Value = int | float | str | bool | None
Evaluator = Callable[[Properties], Value]
Predicate = Callable[[Properties], bool]

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(\.[0-9]*)?|(\.)[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
INT_DIGITS_MAX = 4000  # below Python's int-from-string limit (4300); longer ones read as float

_ORDER: dict[Compare, Callable[[Any, Any], bool]] = {
    Compare.LT: operator.lt,
    Compare.LE: operator.le,
    Compare.GT: operator.gt,
    Compare.GE: operator.ge,
}
_MIRROR = {
    Compare.EQ: Compare.EQ,
    Compare.NE: Compare.NE,
    Compare.LT: Compare.GT,
    Compare.LE: Compare.GE,
    Compare.GT: Compare.LT,
    Compare.GE: Compare.LE,
}
_MATCH: dict[Match, Callable[[str, str], bool]] = {
    Match.CONTAINS: operator.contains,
    Match.STARTSWITH: str.startswith,
    Match.ENDSWITH: str.endswith,
}


def as_number(text: str) -> int | float | None:
    """A property value read as a decimal number, or None when it is not one."""
    match = _DECIMAL.fullmatch(text)
    if match is None:
        return None
    integral = match.group(1) is None and match.group(2) is None and match.group(3) is None
    if integral and len(text) <= INT_DIGITS_MAX:
        return int(text)
    return float(text)


def as_boolean(text: str) -> bool | None:
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def equal(left: Value, right: Value) -> bool | None:
    """`left = right` in three-valued logic."""
    if left is None or right is None:
        return None
    if isinstance(left, bool) or isinstance(right, bool):
        flag, other = (left, right) if isinstance(left, bool) else (right, left)
        if isinstance(other, bool):
            return flag == other
        if isinstance(other, str):
            read = as_boolean(other)
            return None if read is None else read == flag
        return False
    if isinstance(left, str) and isinstance(right, str):
        return left == right
    left_number = as_number(left) if isinstance(left, str) else left
    right_number = as_number(right) if isinstance(right, str) else right
    if left_number is None or right_number is None:
        return None
    return left_number == right_number


def order(op: Compare, left: Value, right: Value) -> bool | None:
    """`left op right` for < <= > >=: numbers only, strings read as numbers."""
    if left is None or right is None or isinstance(left, bool) or isinstance(right, bool):
        return None
    left_number = as_number(left) if isinstance(left, str) else left
    right_number = as_number(right) if isinstance(right, str) else right
    if left_number is None or right_number is None:
        return None
    return _ORDER[op](left_number, right_number)


def compile_condition(node: Node) -> Predicate:
    """The predicate of a parsed condition: True exactly when the condition is TRUE."""
    evaluate = compile_node(node)

    def matches(properties: Properties) -> bool:
        return evaluate(properties) is True

    return matches


def compile_node(node: Node) -> Evaluator:
    """A closure giving `node`'s value (None for NULL or UNKNOWN) for a message's properties."""
    if isinstance(node, Literal):
        value = node.value
        return lambda _properties: value
    if isinstance(node, Property):
        return operator.methodcaller("get", node.name)
    if isinstance(node, Comparison):
        return _comparison(node)
    if isinstance(node, Between):
        return _between(node)
    if isinstance(node, In):
        return _in(node)
    if isinstance(node, IsNull):
        return _is_null(node)
    if isinstance(node, StringMatch):
        return _string_match(node)
    if isinstance(node, Truth):
        return _truth(node)
    if isinstance(node, Not):
        return _not(node)
    if isinstance(node, And | Or):
        return _junction(node)
    raise AssertionError(f"unknown node {node!r}")


def _comparison(node: Comparison) -> Evaluator:
    op, left, right = node.op, node.left, node.right
    if isinstance(left, Literal) and isinstance(right, Property):
        op, left, right = _MIRROR[op], right, left
    if isinstance(left, Property) and isinstance(right, Literal) and right.value is not None:
        return _property_against_constant(op, left.name, right.value)
    left_value, right_value = compile_node(left), compile_node(right)
    if op is Compare.EQ:
        return lambda p: equal(left_value(p), right_value(p))
    if op is Compare.NE:
        return lambda p: _negate(equal(left_value(p), right_value(p)))
    return lambda p: order(op, left_value(p), right_value(p))


def _property_against_constant(op: Compare, name: str, constant: Value) -> Evaluator:
    """The common case, `a > 5` or `b = 'x'`, without the generic dispatch."""
    if is_number(constant) and op in _ORDER:
        test = _ORDER[op]

        def ordered(properties: Properties) -> bool | None:
            value = properties.get(name)
            if value is None:
                return None
            number = as_number(value)
            return None if number is None else test(number, constant)

        return ordered
    if isinstance(constant, str) and op in (Compare.EQ, Compare.NE):
        negated = op is Compare.NE

        def same_string(properties: Properties) -> bool | None:
            value = properties.get(name)
            return None if value is None else (value == constant) != negated

        return same_string
    if op is Compare.EQ:
        return lambda p: equal(p.get(name), constant)
    if op is Compare.NE:
        return lambda p: _negate(equal(p.get(name), constant))
    return lambda p: order(op, p.get(name), constant)


def _between(node: Between) -> Evaluator:
    """low <= value <= high (NOT: value < low OR value > high), as RocketMQ builds it; the
    value is read once."""
    if (
        isinstance(node.value, Property)
        and isinstance(node.low, Literal)
        and isinstance(node.high, Literal)
    ):
        return _property_between_constants(
            node.value.name, node.low.value, node.high.value, node.negated
        )
    value, low, high, negated = (
        compile_node(node.value),
        compile_node(node.low),
        compile_node(node.high),
        node.negated,
    )

    def between(properties: Properties) -> bool | None:
        current = value(properties)
        above = order(Compare.GE, current, low(properties))
        below = order(Compare.LE, current, high(properties))
        if above is False or below is False:
            return negated
        if above is None or below is None:
            return None
        return not negated

    return between


def _property_between_constants(name: str, low: Value, high: Value, negated: bool) -> Evaluator:
    """The common case, `a BETWEEN 0 AND 3` (the parser made sure both bounds are numbers)."""
    assert is_number(low) and is_number(high)
    lowest, highest = low, high

    def between(properties: Properties) -> bool | None:
        value = properties.get(name)
        if value is None:
            return None
        number = as_number(value)
        if number is None:
            return None
        return (lowest <= number <= highest) != negated  # type: ignore[operator]

    return between


def _in(node: In) -> Evaluator:
    name, strings, negated = node.value.name, node.strings, node.negated

    def contained(properties: Properties) -> bool | None:
        value = properties.get(name)
        return None if value is None else (value in strings) != negated

    return contained


def _is_null(node: IsNull) -> Evaluator:
    value, negated = compile_node(node.value), node.negated
    return lambda p: (value(p) is None) != negated


def _string_match(node: StringMatch) -> Evaluator:
    """RocketMQ 5's CONTAINS, STARTSWITH, ENDSWITH: FALSE for an empty search string and for
    a value that is not a string, negated or not."""
    value, text, negated, test = (
        compile_node(node.value),
        node.text,
        node.negated,
        _MATCH[node.kind],
    )

    def matched(properties: Properties) -> bool | None:
        current = value(properties)
        if current is None:
            return None
        if not text or not isinstance(current, str):
            return False
        return test(current, text) != negated

    return matched


def _truth(node: Truth) -> Evaluator:
    """A bare property as a condition: TRUE for 'true' (any case), UNKNOWN when missing,
    FALSE otherwise (RocketMQ's boolean cast; there a string property is always FALSE)."""
    name = node.value.name

    def truth(properties: Properties) -> bool | None:
        value = properties.get(name)
        return None if value is None else value.lower() == "true"

    return truth


def _not(node: Not) -> Evaluator:
    operand = compile_node(node.operand)
    return lambda p: _negate(operand(p))


def _negate(value: Value) -> bool | None:
    return None if value is None else not value


def _junction(node: And | Or) -> Evaluator:
    """AND (OR) of any number of conditions: decided by the first FALSE (TRUE), else UNKNOWN
    if any was, else TRUE (FALSE). A flat loop, so a long chain costs no recursion."""
    operands = tuple(compile_node(n) for n in node.operands)
    decisive = isinstance(node, Or)  # the value that settles it

    def junction(properties: Properties) -> bool | None:
        unknown = False
        for operand in operands:
            value = operand(properties)
            if value is None:
                unknown = True
            elif value is decisive:
                return decisive
        return None if unknown else not decisive

    return junction
