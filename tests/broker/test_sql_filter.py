"""SQL92 filtering (broker/filter/, docs/filtering.md): each grammar element, syntax errors and
their positions, missing properties, strings against numbers, three-valued logic; then pulls
from a live in-process group: exactly the matching messages cross the network."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.filter.compiler import Value, compile_condition, compile_node
from broker.filter.errors import FilterSyntaxError, FilterTooLarge, UnknownExpressionType
from broker.filter.parser import NESTING_DEPTH_MAX, parse
from broker.filter.subscription import (
    EXPRESSION_CHARS_MAX,
    SQL92,
    TAG,
    compile_subscription,
)
from broker.filter.syntax import Compare, Comparison, Literal, Property
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import Connection
from remoting.tag_hash import tags_code
from tests.broker import rmq
from tests.broker.group import Group, broker_group, send_request


def value(expression: str, **properties: str) -> Value:
    """The three-valued value of `expression` (None: UNKNOWN) for a message's properties."""
    return compile_node(parse(expression))(properties)


def matches(expression: str, **properties: str) -> bool:
    return compile_condition(parse(expression))(properties)


def syntax_error(expression: str) -> FilterSyntaxError:
    with pytest.raises(FilterSyntaxError) as info:
        parse(expression)
    return info.value


# --- grammar elements --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "a", "expected"),
    [("a > 5", "6", True), ("a > 5", "5", False), ("a >= 5", "5", True), ("a >= 5", "4", False),
     ("a < 5", "4", True), ("a < 5", "5", False), ("a <= 5", "5", True), ("a <= 5", "6", False),
     ("a = 5", "5", True), ("a = 5", "6", False), ("a <> 5", "6", True), ("a <> 5", "5", False),
     ("a > 9", "10", True),  # as numbers, not as text ("10" < "9")
     ("5 < a", "6", True), ("5 >= a", "6", False),  # the constant on the left
     ("a > 2.5", "3", True), ("a < -1", "-2", True), ("a = 5", "+5", True), ("a = 0.5", ".5", True),
     ("a = 100", "1e2", True), ("a > 1", "1.0000001", True)],
)  # fmt: skip
def test_numeric_comparisons(expression: str, a: str, expected: bool) -> None:
    assert matches(expression, a=a) is expected


def test_property_against_property_compares_numbers_for_order_and_text_for_equality() -> None:
    assert matches("a > b", a="10", b="9")
    assert not matches("a = b", a="3", b="3.0")  # both strings: compared as strings
    assert matches("a = b", a="x", b="x")
    assert value("a > b", a="x", b="1") is None


@pytest.mark.parametrize(
    ("expression", "a", "expected"),
    [("a BETWEEN 1 AND 3", "1", True), ("a BETWEEN 1 AND 3", "3", True),
     ("a BETWEEN 1 AND 3", "2.5", True), ("a BETWEEN 1 AND 3", "0", False),
     ("a BETWEEN 1 AND 3", "4", False), ("a BETWEEN -3 AND -1", "-2", True),
     ("a BETWEEN 1 AND 1", "1", True), ("a NOT BETWEEN 1 AND 3", "0", True),
     ("a NOT BETWEEN 1 AND 3", "2", False), ("a NOT BETWEEN 1 AND 3", "3", False),
     ("a BETWEEN 0.5 AND 1.5", "1", True)],
)  # fmt: skip
def test_between(expression: str, a: str, expected: bool) -> None:
    assert matches(expression, a=a) is expected


@pytest.mark.parametrize(
    ("expression", "b", "expected"),
    [("b = 'abc'", "abc", True), ("b = 'abc'", "ABC", False), ("b = 'abc'", "abc ", False),
     ("b <> 'abc'", "abd", True), ("b <> 'abc'", "abc", False),
     ("b IN ('x', 'y')", "y", True), ("b IN ('x', 'y')", "z", False), ("b IN ('x')", "x", True),
     ("b NOT IN ('x', 'y')", "z", True), ("b NOT IN ('x', 'y')", "x", False),
     ("b = 'it''s'", "it's", True), ("b = ''''", "'", True), ("b = ''", "", True),
     ("b = 'a b -- c /* d */'", "a b -- c /* d */", True), ("b = 'ü€'", "ü€", True),
     ("b = '10'", "10.0", False), ("'abc' = b", "abc", True)],
)  # fmt: skip
def test_strings(expression: str, b: str, expected: bool) -> None:
    assert matches(expression, b=b) is expected


@pytest.mark.parametrize(
    ("expression", "b", "expected"),
    [("b CONTAINS 'bc'", "abcd", True), ("b CONTAINS 'x'", "abcd", False),
     ("b NOT CONTAINS 'x'", "abcd", True), ("b STARTSWITH 'ab'", "abcd", True),
     ("b STARTSWITH 'bc'", "abcd", False), ("b NOT STARTSWITH 'bc'", "abcd", True),
     ("b ENDSWITH 'cd'", "abcd", True), ("b NOT ENDSWITH 'cd'", "abcd", False),
     ("b CONTAINS ''", "abcd", False), ("b NOT CONTAINS ''", "abcd", False)],
)  # fmt: skip
def test_string_tests_of_rocketmq_5(expression: str, b: str, expected: bool) -> None:
    """CONTAINS, STARTSWITH, ENDSWITH; an empty search string matches nothing, as RocketMQ."""
    assert matches(expression, b=b) is expected


def test_is_null_and_is_not_null() -> None:
    assert matches("a IS NULL")
    assert not matches("a IS NULL", a="1")
    assert matches("a IS NOT NULL", a="1")
    assert not matches("a IS NOT NULL")
    assert matches("a is not null AND b IS NULL", a="x")


def test_and_or_not_follow_sql_precedence() -> None:
    """Comparisons bind tightest, then NOT, then AND, then OR."""
    assert parse("a = 1 OR b = 1 AND c = 1") == parse("a = 1 OR (b = 1 AND c = 1)")
    assert parse("NOT a = 1 AND b = 1") == parse("(NOT (a = 1)) AND b = 1")
    assert parse("NOT a = 1 OR NOT b = 1") == parse("(NOT a = 1) OR (NOT b = 1)")
    assert matches("NOT a = 1", a="2")  # RocketMQ's grammar reads this as (NOT a) = 1
    assert matches("a = 1 OR b = 1 AND c = 1", a="1", b="0", c="0")
    assert not matches("(a = 1 OR b = 1) AND c = 1", a="1", b="0", c="0")
    assert matches("NOT NOT a = 1", a="1")
    assert matches("a = 1 AND b = 2 AND c = 3", a="1", b="2", c="3")
    assert not matches("a = 1 AND b = 2 AND c = 3", a="1", b="2", c="4")
    assert matches("a = 1 OR b = 2 OR c = 3", c="3")


def test_parentheses() -> None:
    assert parse("((a > 1))") == parse("a > 1")
    assert matches("(a = 1 OR a = 2) AND (b = 1 OR b = 2)", a="2", b="1")
    assert not matches("(a = 1 OR a = 2) AND (b = 1 OR b = 2)", a="2", b="3")
    assert parse("a > (-(5))") == parse("a > -5")


@pytest.mark.parametrize(
    ("text", "constant"),
    [("0", 0), ("42", 42), ("-42", -42), ("+7", 7), ("- 7", -7), ("7L", 7), ("7l", 7),
     ("9223372036854775807", 2**63 - 1), ("-9223372036854775807", -(2**63) + 1), ("007", 7),
     ("3.25", 3.25), ("5.", 5.0), (".5", 0.5), ("5e2", 500.0), ("5E-2", 0.05), ("1.5e+1", 15.0),
     ("-0.5", -0.5)],
)  # fmt: skip
def test_numeric_constants(text: str, constant: float) -> None:
    node = parse(f"a = {text}")
    assert isinstance(node, Comparison) and isinstance(node.right, Literal)
    assert node.right.value == constant
    assert type(node.right.value) is type(constant)


def test_boolean_and_null_constants() -> None:
    assert matches("TRUE") and not matches("FALSE") and not matches("NULL")
    assert matches("true OR a = 1") and not matches("false AND a = 1", a="1")
    assert matches("flag = TRUE", flag="true") and matches("flag = TRUE", flag="TRUE")
    assert matches("flag = FALSE", flag="False") and not matches("flag = TRUE", flag="false")
    assert value("flag = TRUE", flag="yes") is None  # not a boolean: UNKNOWN
    assert matches("flag", flag="true") and not matches("flag", flag="yes")
    assert value("flag") is None
    assert not matches("a = TRUE", a="1")  # a number is never a boolean
    assert value("NULL OR a = 1") is None and matches("NULL OR a = 1", a="1")


def test_keywords_ignore_case_and_identifiers_do_not() -> None:
    assert parse("a between 1 and 3") == parse("a BETWEEN 1 AND 3") == parse("a BeTwEeN 1 aNd 3")
    assert parse("a is not null or b in ('x')") == parse("a IS NOT NULL OR b IN ('x')")
    assert matches("not (a = 1)", a="2")
    assert not matches("A = 1", a="1")
    assert matches("A = 1", A="1")


def test_identifiers() -> None:
    assert matches("$x = 1 AND _y1 = 2 AND Camel_Case9 = 3", **{"$x": "1", "_y1": "2",
                   "Camel_Case9": "3"})  # fmt: skip
    assert matches("TAGS = 'TagA'", TAGS="TagA")  # system properties are properties too
    assert matches("KEYS = 'k1 k2'", KEYS="k1 k2")
    assert matches("nothing = 1 OR notable = 2", notable="2")  # keywords only as whole words
    node = parse("inx = 1")
    assert isinstance(node, Comparison) and node.left == Property("inx")


def test_comments_and_whitespace() -> None:
    assert parse("/* lead */ a\t=\r\n1 -- trailing") == parse("a = 1")
    assert parse("a = 1 -- c\nAND b = 2") == parse("a = 1 AND b = 2")
    assert parse("a/**/=/* x */1") == parse("a = 1")


def test_constant_comparisons_fold_to_their_value() -> None:
    assert matches("1 = 1") and not matches("1 = 2") and matches("'x' = 'x'")
    assert matches("1 < 2.5") and matches("1 = 1.0")


def test_long_chains_and_deep_nesting() -> None:
    """A long AND/OR chain is one flat node; nesting is bounded."""
    chain = " AND ".join(f"p{i} = {i}" for i in range(3000))
    props = {f"p{i}": str(i) for i in range(3000)}
    assert compile_condition(parse(chain))(props)
    assert not compile_condition(parse(chain))({**props, "p2999": "0"})
    deep = "(" * NESTING_DEPTH_MAX + "a = 1" + ")" * NESTING_DEPTH_MAX
    assert matches(deep, a="1")
    error = syntax_error("(" * (NESTING_DEPTH_MAX + 1) + "a = 1" + ")" * (NESTING_DEPTH_MAX + 1))
    assert error.position == NESTING_DEPTH_MAX and "nested" in error.expected
    assert matches("NOT " * NESTING_DEPTH_MAX + "a = 1", a="1")


# --- syntax errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "position", "expected", "found"),
    [("", 0, "a property, a number", "the end"),
     ("a >", 3, "a property, a number", "the end"),
     ("a > 1 b = 2", 6, "AND, OR or the end", "property b"),
     ("(a > 1", 6, "AND, OR or ')'", "the end"),
     ("a > 1)", 5, "AND, OR or the end", "')'"),
     ("a = 1 AND", 9, "a property, a number", "the end"),
     ("a = 1 OR OR b = 2", 9, "a property, a number", "OR"),
     ("a != 1", 2, "<> (not equal)", "'!'"),
     ("a == 1", 3, "a property, a number", "'='"),
     ("a # 1", 2, "a token", "'#'"),
     ("a = 'abc", 4, "a closing quote", "the end"),
     ("a = 1 /* open", 6, "*/", "the end"),
     ("a > 'x'", 4, "a number", "'x'"),
     ("'x' < a", 0, "a number", "'x'"),
     ("a > TRUE", 4, "a number", "TRUE"),
     ("a = NULL", 4, "NULL is tested by IS", "NULL"),
     ("a <> NULL", 5, "NULL is tested by IS", "NULL"),
     ("TRUE = 1", 7, "comparable with TRUE", "1"),
     ("a BETWEEN 3 AND 1", 16, "at least the low bound, 3", "1"),
     ("a BETWEEN 1 OR 3", 12, "AND between the bounds", "OR"),
     ("a BETWEEN 'a' AND 'b'", 10, "a number", "'a'"),
     ("a BETWEEN NULL AND 1", 10, "not NULL", "NULL"),
     ("a IN ()", 6, "a 'string' in the IN list", "')'"),
     ("a IN ('x' 'y')", 10, "',' or ')'", "'y'"),
     ("a IN (1, 2)", 6, "a 'string' in the IN list", "1"),
     ("a IN 'x'", 5, "'(' after IN", "'x'"),
     ("1 IN ('x')", 0, "a property before IN", "1"),
     ("a NOT 1", 6, "BETWEEN, IN, CONTAINS", "1"),
     ("a IS 1", 5, "NULL or NOT", "1"),
     ("a IS NOT 1", 9, "NULL after IS NOT", "1"),
     ("a CONTAINS 1", 11, "a 'string' after CONTAINS", "1"),
     ("-a > 1", 1, "a number after '-'", "property a"),
     ("a > -'x'", 5, "a number after '-'", "'x'"),
     ("a > 9223372036854775808", 4, "at most 9223372036854775807", "9223372036854775808"),
     ("a > 1e999", 4, "within a double's range", "1e999"),
     ("a > .", 4, "a digit after '.'", "'.'"),
     ("5", 0, "a condition", "5"),
     ("'x' AND a = 1", 0, "a condition", "'x'"),
     ("a > 1 AND 2", 10, "a condition", "2"),
     ("NOT 'x'", 4, "a condition", "'x'"),
     ("(a > 1) > 2", 0, "a number or a property", "a condition"),
     ("in = 1", 0, "a property, a number", "IN")],
)  # fmt: skip
def test_syntax_errors_carry_position_and_expectation(
    expression: str, position: int, expected: str, found: str
) -> None:
    error = syntax_error(expression)
    assert (error.position, error.expression) == (position, expression), str(error)
    assert expected in error.expected, str(error)
    assert found in error.found, str(error)
    assert str(error).startswith(f"SQL92 syntax error at character {position}: expected ")


def test_subscription_refusals() -> None:
    with pytest.raises(UnknownExpressionType, match="'SQL'"):
        compile_subscription("SQL", "a > 1")
    with pytest.raises(FilterTooLarge):
        compile_subscription(SQL92, "a = 1 OR " * (EXPRESSION_CHARS_MAX // 9) + "a = 2")
    with pytest.raises(FilterSyntaxError, match="character 9"):
        compile_subscription(SQL92, "a between")


def test_subscriptions_compile_once_per_text() -> None:
    first = compile_subscription(SQL92, "a BETWEEN 0 AND 3 AND b IS NULL")
    assert compile_subscription(SQL92, "a BETWEEN 0 AND 3 AND b IS NULL") is first
    assert first.by_properties and first.tag_codes is None
    assert first.predicate is not None and first.predicate({"a": "2"})
    tags = compile_subscription(TAG, "TagA || TagB")
    assert tags.tag_codes == {tags_code("TagA"), tags_code("TagB")} and not tags.by_properties
    for everything in (compile_subscription(None, "*"), compile_subscription("", None)):
        assert everything.tag_codes is None and everything.predicate is None


# --- missing properties, strings against numbers -------------------------------------------------

CONDITIONS_ON_A = [
    "a > 1", "a >= 1", "a < 1", "a <= 1", "a = 1", "a <> 1", "a = 'x'", "a <> 'x'",
    "a BETWEEN 0 AND 3", "a NOT BETWEEN 0 AND 3", "a IN ('x')", "a NOT IN ('x')",
    "a CONTAINS 'x'", "a NOT STARTSWITH 'x'", "a = TRUE", "a", "a > b", "a = b",
]  # fmt: skip


@pytest.mark.parametrize("condition", CONDITIONS_ON_A)
def test_a_missing_property_is_unknown_and_never_matches(condition: str) -> None:
    assert value(condition, b="1") is None
    assert not matches(condition, b="1")
    assert not matches(f"NOT ({condition})", b="1")  # NOT UNKNOWN is UNKNOWN
    assert matches(f"({condition}) OR b = 1", b="1")  # TRUE OR UNKNOWN
    assert value(f"({condition}) AND b = 2", b="1") is False  # FALSE AND UNKNOWN
    assert matches(f"({condition}) IS NULL", b="1")


@pytest.mark.parametrize(
    ("expression", "a"),
    [("a > 3", "abc"), ("a = 3", "abc"), ("a <> 3", "abc"), ("a BETWEEN 0 AND 3", "two"),
     ("a > 3", " 4"), ("a > 3", "0x10"), ("a > 3", "4f"), ("a > 3", "NaN"), ("a > 3", "Infinity"),
     ("a > 3", ""), ("a > 3", "1,5"), ("a < 3", "٣")],
)  # fmt: skip
def test_a_value_that_is_not_a_number_makes_a_numeric_comparison_unknown(
    expression: str, a: str
) -> None:
    assert value(expression, a=a) is None
    assert not matches(expression, a=a) and not matches(f"NOT ({expression})", a=a)


def test_strings_against_numbers() -> None:
    assert matches("a = 3", a="3.0") and matches("a = 3.0", a="3")  # numbers: equal
    assert not matches("a = '3'", a="3.0")  # strings: not
    assert matches("a > 99", a="100") and not matches("a > 99", a="99")
    assert matches("a = 1234567890123456789", a="1234567890123456789")  # exact, not as doubles
    assert not matches("a = 1234567890123456789", a="1234567890123456788")
    big = str(2**70)
    assert matches(f"a > {2**62}", a=big)  # a value beyond a long is still a number


# --- properties, with hypothesis -----------------------------------------------------------------

LONG = st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False)


@settings(deadline=None)  # the machine is shared: timings vary
@given(LONG)
def test_integers_round_trip(n: int) -> None:
    node = parse(f"a = {n}")
    assert node == Comparison(Compare.EQ, Property("a"), Literal(n))
    assert matches(f"a = {n}", a=str(n)) and not matches(f"a = {n}", a=str(n + 1))
    assert matches(f"a >= {n} AND a <= {n}", a=str(n))


@settings(deadline=None)  # the machine is shared: timings vary
@given(FINITE)
def test_decimals_round_trip(x: float) -> None:
    text = repr(x) if "." in repr(x) or "e" in repr(x) else repr(x) + ".0"
    node = parse(f"a = {text}")
    assert isinstance(node, Comparison) and node.right == Literal(x)
    assert matches(f"a = {text}", a=repr(x))


VALUES = st.one_of(
    st.none(),
    st.integers(-50, 50).map(str),
    FINITE.map(repr),
    st.sampled_from(["abc", "", " 1", "1e3", "-0", "+2", ".5", "5."]),
    st.text(max_size=5),
)
BOUNDS = st.one_of(st.integers(-60, 60), st.floats(-60, 60, allow_nan=False))


@settings(deadline=None)  # the machine is shared: timings vary
@given(VALUES, BOUNDS, BOUNDS)
def test_between_is_the_and_of_two_comparisons(a: str | None, x: float, y: float) -> None:
    low, high = sorted((x, y))
    props = {} if a is None else {"a": a}
    bounds = f"{low!r} AND {high!r}"
    between = compile_node(parse(f"a BETWEEN {bounds}"))(props)
    assert between == compile_node(parse(f"a >= {low!r} AND a <= {high!r}"))(props)
    not_between = compile_node(parse(f"a NOT BETWEEN {bounds}"))(props)
    assert not_between == compile_node(parse(f"a < {low!r} OR a > {high!r}"))(props)
    assert not_between == compile_node(parse(f"NOT (a BETWEEN {bounds})"))(props)
    general = compile_node(parse("a BETWEEN lo AND hi"))(
        {**props, "lo": repr(low), "hi": repr(high)}
    )
    assert general == between  # the generic path agrees with the constant one


Kleene = bool | None
Reference = Callable[[dict[str, str]], Kleene]
NAMES = ("a", "b", "c")
PROPERTY_VALUES = st.dictionaries(
    st.sampled_from(NAMES), st.sampled_from(["-1", "0", "1", "2", "x"])
)


def _numeric(text: str | None) -> int | None:
    if text is None or text == "x":
        return None
    return int(text)


@st.composite
def _leaf(draw: st.DrawFn) -> tuple[str, Reference]:
    name = draw(st.sampled_from(NAMES))
    kind = draw(st.sampled_from(["order", "eq", "null", "in", "constant"]))
    if kind == "order":
        op = draw(st.sampled_from(["<", "<=", ">", ">=", "<>", "="]))
        n = draw(st.integers(-2, 3))
        tests = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__,
                 "<>": int.__ne__, "=": int.__eq__}  # fmt: skip

        def order(p: dict[str, str]) -> Kleene:
            v = _numeric(p.get(name))
            return None if v is None else tests[op](v, n)

        return f"{name} {op} {n}", order
    if kind == "eq":
        s = draw(st.sampled_from(["x", "1"]))
        return f"{name} = '{s}'", lambda p: None if name not in p else p[name] == s
    if kind == "null":
        negated = draw(st.booleans())
        text = f"{name} IS {'NOT ' if negated else ''}NULL"
        return text, lambda p: (name in p) == negated
    if kind == "in":
        return f"{name} IN ('0', 'x')", lambda p: None if name not in p else p[name] in ("0", "x")
    constant = draw(st.sampled_from([True, False, None]))
    return {True: "TRUE", False: "FALSE", None: "NULL"}[constant], lambda p: constant


def _not(child: tuple[str, Reference]) -> tuple[str, Reference]:
    text, fn = child

    def negation(p: dict[str, str]) -> Kleene:
        v = fn(p)
        return None if v is None else not v

    return f"NOT ({text})", negation


def _junction(word: str, children: list[tuple[str, Reference]]) -> tuple[str, Reference]:
    decisive = word == "OR"

    def junction(p: dict[str, str]) -> Kleene:
        values = [fn(p) for _, fn in children]
        if decisive in values:
            return decisive
        return None if None in values else not decisive

    return f" {word} ".join(f"({text})" for text, _ in children), junction


CONDITIONS = st.recursive(
    _leaf(),
    lambda inner: st.one_of(
        inner.map(_not),
        st.lists(inner, min_size=2, max_size=4).map(lambda c: _junction("AND", c)),
        st.lists(inner, min_size=2, max_size=4).map(lambda c: _junction("OR", c)),
    ),
    max_leaves=12,
)


@settings(deadline=None)  # the machine is shared: timings vary
@given(CONDITIONS, PROPERTY_VALUES)
def test_conditions_follow_kleene_logic(
    condition: tuple[str, Reference], props: dict[str, str]
) -> None:
    """Random conditions agree with a plain three-valued model, and match exactly when TRUE."""
    text, reference = condition
    expected = reference(props)
    assert compile_node(parse(text))(props) == expected
    assert compile_condition(parse(text))(props) is (expected is True)


# --- pulls from a live group ---------------------------------------------------------------------

TOPIC = "SqlTopic"


def _mixed_stream() -> list[tuple[bytes, dict[str, str]]]:
    """40 messages: `a` in 0..9 on most, none on every fourth, a non-number on two."""
    stream = []
    for i in range(40):
        props = {"TAGS": "TagA", "i": str(i)}
        if i % 4 != 3:
            props["a"] = str(i % 10)
        if i in (5, 21):
            props["a"] = "three"
        stream.append((f"m{i}".encode(), props))
    return stream


def _wanted(stream: list[tuple[bytes, dict[str, str]]]) -> list[bytes]:
    return [
        body
        for body, props in stream
        if props.get("a", "x").isdigit() and 0 <= int(props["a"]) <= 3
    ]


async def _send_all(conn: Connection, stream: list[tuple[bytes, dict[str, str]]]) -> None:
    for body, props in stream:
        response = await conn.request(send_request(TOPIC, body, properties=props), timeout_s=10)
        assert response.code == ResponseCode.SUCCESS, response.remark


async def _drain(
    conn: Connection,
    *,
    subscription: str | None,
    expression_type: str | None = "SQL92",
    group: str = "cg",
    offset: int = 0,
) -> tuple[list[bytes], list[int]]:
    """Pull queue 0 from `offset` to its end, 4 at a time: the bodies and the codes seen."""
    bodies: list[bytes] = []
    codes: list[int] = []
    for _ in range(200):
        response, messages = await rmq.pull(
            conn, TOPIC, 0, offset, group=group, max_nums=4, subscription=subscription,
            expression_type=expression_type,
        )  # fmt: skip
        codes.append(response.code)
        if response.code == ResponseCode.PULL_NOT_FOUND:
            return bodies, codes
        assert response.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY), (
            response.code,
            response.remark,
        )
        assert len(messages) <= 4
        bodies += [m.body for m in messages]
        offset = int(response.ext_fields["nextBeginOffset"])
    raise AssertionError("the queue never ended")


def _heartbeat(group: str, subscription: str, expression_type: str, version: int = 1) -> bytes:
    return json.dumps(
        {
            "clientID": "127.0.0.1@sqltest",
            "consumerDataSet": [
                {
                    "groupName": group,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                    "subscriptionDataSet": [
                        {
                            "topic": TOPIC,
                            "subString": subscription,
                            "expressionType": expression_type,
                            "subVersion": version,
                            "tagsSet": [],
                            "codeSet": [],
                            "classFilterMode": False,
                        }
                    ],
                }
            ],
            "producerDataSet": [],
        }
    ).encode()


def leader_connection(group: Group) -> AbstractAsyncContextManager[Connection]:
    return open_connection("127.0.0.1", _port(group, leader=True))


def _port(group: Group, leader: bool) -> int:
    broker = group.leader() if leader else group.follower()
    return broker.config.listen.port


async def test_a_pull_gets_exactly_the_matching_messages(tmp_path: Path) -> None:
    """`a between 0 and 3` over a mixed stream: exactly the messages with a in 0..3, in order,
    from the leader and from a follower; unmatched ones never appear in any answer."""
    stream = _mixed_stream()
    async with broker_group(tmp_path) as group:
        async with leader_connection(group) as conn:
            await _send_all(conn, stream)
        await group.wait_applied_everywhere()
        for leader in (True, False):
            async with open_connection("127.0.0.1", _port(group, leader)) as conn:
                bodies, codes = await _drain(conn, subscription="a between 0 and 3")
                assert bodies == _wanted(stream)
                everything, _ = await _drain(conn, subscription="*", expression_type=None)
                assert everything == [body for body, _ in stream]
                tagged, _ = await _drain(conn, subscription="TAGS = 'TagA' AND i >= 38")
                assert tagged == [b"m38", b"m39"]
                none, codes = await _drain(conn, subscription="a > 100")
                assert none == []
                # the whole queue was one scan that matched nothing: NO_MATCHED_MESSAGE's code
                assert codes == [ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND]
                response, _ = await rmq.pull(
                    conn, TOPIC, 0, 0, subscription="a > 100", expression_type="SQL92"
                )
                assert response.ext_fields["nextBeginOffset"] == str(len(stream))


async def test_bad_expressions_are_refused_with_their_position(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group, leader_connection(group) as conn:
        await _send_all(conn, _mixed_stream()[:4])
        # carried by the pull: SUBSCRIPTION_PARSE_FAILED
        response, _ = await rmq.pull(
            conn, TOPIC, 0, 0, subscription="a between 3", expression_type="SQL92"
        )
        assert response.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "at character 11: expected AND between the bounds" in response.remark
        response, _ = await rmq.pull(conn, TOPIC, 0, 0, subscription="a>1", expression_type="SQL")
        assert response.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "unknown expressionType 'SQL'" in response.remark
        # registered by a heartbeat: the pull relying on it gets FILTER_DATA_NOT_EXIST
        beat = await rmq.call(conn, RequestCode.HEART_BEAT, body=_heartbeat("bad", "a >", SQL92))
        assert beat.code == ResponseCode.SUCCESS
        response, _ = await rmq.pull(conn, TOPIC, 0, 0, group="bad", subscription=None)
        assert response.code == ResponseCode.FILTER_DATA_NOT_EXIST
        assert "at character 3" in response.remark
        # CHECK_CLIENT_CONFIG, the Java consumer's check before it starts
        for expression, kind, code in [
            ("a >", SQL92, ResponseCode.SUBSCRIPTION_PARSE_FAILED),
            ("a > 1", SQL92, ResponseCode.SUCCESS),
            ("TagA || TagB", TAG, ResponseCode.SUCCESS),
        ]:
            body = {
                "clientId": "c",
                "group": "g",
                "subscriptionData": {"topic": TOPIC, "subString": expression,
                                     "expressionType": kind},
            }  # fmt: skip
            check = await rmq.call(
                conn, RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode()
            )
            assert check.code == code, check.remark
            if code != ResponseCode.SUCCESS:
                assert check.remark is not None and "at character 3" in check.remark


async def test_a_heartbeat_subscription_filters_pulls_without_one(tmp_path: Path) -> None:
    """The Java push consumer pulls without its subscription: the one its heartbeat registered
    (compiled then) filters, and a pull asking for a newer version than registered waits."""
    stream = _mixed_stream()
    async with broker_group(tmp_path) as group, leader_connection(group) as conn:
        await _send_all(conn, stream)
        beat = await rmq.call(
            conn, RequestCode.HEART_BEAT, body=_heartbeat("hb", "a BETWEEN 0 AND 3", SQL92, 7)
        )
        assert beat.code == ResponseCode.SUCCESS
        bodies, _ = await _drain(conn, subscription=None, group="hb")
        assert bodies == _wanted(stream)
        listing = await rmq.json_call(
            conn, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "hb"}
        )
        assert listing["subscriptionTable"][TOPIC]["expressionType"] == SQL92
        newer = await rmq.call(
            conn, RequestCode.PULL_MESSAGE,
            {"consumerGroup": "hb", "topic": TOPIC, "queueId": 0, "queueOffset": 0,
             "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
             "subVersion": 8},
        )  # fmt: skip
        assert newer.code == ResponseCode.FILTER_DATA_NOT_LATEST


async def test_a_held_pull_is_not_ended_by_messages_it_skips(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        leader = group.leader()
        async with (
            open_connection("127.0.0.1", leader.config.listen.port) as conn,
            open_connection("127.0.0.1", leader.config.listen.port) as sender,
        ):
            await _send_all(sender, [(b"first", {"a": "9"})])
            answered: list[tuple[int, list[bytes], str]] = []

            async def held_pull() -> None:
                response, messages = await rmq.pull(
                    conn, TOPIC, 0, 1, suspend_ms=20_000, subscription="a = 1",
                    expression_type="SQL92",
                )  # fmt: skip
                answered.append(
                    (
                        response.code,
                        [m.body for m in messages],
                        response.ext_fields["nextBeginOffset"],
                    )
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(held_pull)
                await trio.testing.wait_all_tasks_blocked()  # the pull is held
                await _send_all(sender, [(b"skipped", {"a": "2"}), (b"no-a", {})])
                await trio.testing.wait_all_tasks_blocked()
                assert answered == []
                await _send_all(sender, [(b"wanted", {"a": "1"})])
            assert answered == [(ResponseCode.SUCCESS, [b"wanted"], "4")]


async def test_enable_property_filter_false_refuses_sql92(tmp_path: Path) -> None:
    async with (
        broker_group(tmp_path, enable_property_filter=False) as group,
        leader_connection(group) as conn,
    ):
        await _send_all(conn, _mixed_stream()[:4])
        response, _ = await rmq.pull(
            conn, TOPIC, 0, 0, subscription="a > 1", expression_type="SQL92"
        )
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert response.remark == "The broker does not support consumer to filter message by SQL92"
        bodies, _ = await _drain(conn, subscription="*", expression_type="TAG")
        assert len(bodies) == 4  # tags still work
        body = {"subscriptionData": {"topic": TOPIC, "subString": "a > 1", "expressionType": SQL92}}
        check = await rmq.call(
            conn, RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode()
        )
        assert check.code == ResponseCode.SYSTEM_ERROR
