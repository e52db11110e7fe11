"""Recursive-descent parser of SQL92 filter expressions, into the tree of syntax.py.

    condition  := disjunct (OR disjunct)*
    disjunct   := negation (AND negation)*
    negation   := NOT negation | predicate
    predicate  := operand [ ('=' | '<>' | '<' | '<=' | '>' | '>=') operand
                          | [NOT] BETWEEN operand AND operand
                          | [NOT] IN '(' string (',' string)* ')'
                          | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string
                          | IS [NOT] NULL ]
    operand    := ('+' | '-') operand | literal | property | '(' condition ')'

Precedence is SQL's: comparisons, then NOT, then AND, then OR. (RocketMQ's grammar, inherited
from ActiveMQ, binds NOT tighter than a comparison, so there `NOT a = 1` compares NOT(a) with 1
and never matches; here it means NOT (a = 1). docs/decisions.md.) The checks RocketMQ makes
while building its tree are made here too, each with the offending token's position: only
numbers compare with < <= > >= and BETWEEN, NULL compares only through IS [NOT] NULL, IN needs a
property on its left, a BETWEEN of two numbers needs low <= high.
"""

from __future__ import annotations

import attrs

from broker.filter.errors import FilterSyntaxError
from broker.filter.lexer import Kind, Token, tokenize
from broker.filter.syntax import (
    CONDITIONS,
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

# Parentheses, NOTs and signs nested inside each other: each level is a few Python frames while
# parsing and compiling, so this keeps far from the interpreter's recursion limit (1000).
NESTING_DEPTH_MAX = 64

OPERAND = "a property, a number, a 'string', TRUE, FALSE, NULL or '('"
COMPARISONS = {op.value: op for op in Compare}
NEGATABLE = ("BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH")


def parse(expression: str) -> Node:
    """The condition `expression` states. Raises FilterSyntaxError naming the position."""
    parser = _Parser(expression)
    node = parser.condition()
    token = parser.peek()
    if token.kind is not Kind.END:
        raise parser.error(token, "AND, OR or the end of the expression")
    return parser.as_condition(node)


def describe(node: Node) -> str:
    """How an error names a parsed operand."""
    if isinstance(node, Literal):
        return literal_text(node.value)
    if isinstance(node, Property):
        return f"property {node.name}"
    return "a condition"


def literal_text(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Parser:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = tokenize(expression)
        self.next = 0
        self.depth = 0

    # --- tokens ------------------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.next + ahead, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.peek()
        if token.kind is not Kind.END:
            self.next += 1
        return token

    def accept(self, kind: Kind, text: str) -> Token | None:
        token = self.peek()
        if token.kind is kind and token.text == text:
            return self.take()
        return None

    def expect(self, kind: Kind, text: str, expected: str) -> Token:
        token = self.accept(kind, text)
        if token is None:
            raise self.error(self.peek(), expected)
        return token

    def error(self, token: Token, expected: str) -> FilterSyntaxError:
        return FilterSyntaxError(self.expression, token.position, expected, token.describe())

    def node_error(self, node: Node, expected: str) -> FilterSyntaxError:
        return FilterSyntaxError(self.expression, node.position, expected, describe(node))

    def nest(self, token: Token) -> None:
        self.depth += 1
        if self.depth > NESTING_DEPTH_MAX:
            raise self.error(
                token, f"at most {NESTING_DEPTH_MAX} nested parentheses, NOTs and signs"
            )

    # --- conditions --------------------------------------------------------------------------

    def as_condition(self, node: Node) -> Node:
        """`node` where TRUE/FALSE/unknown is wanted: conditions and TRUE, FALSE, NULL as they
        are, a bare property read as a boolean; a number or string is refused."""
        if isinstance(node, CONDITIONS):
            return node
        if isinstance(node, Property):
            return Truth(node, node.position)
        if isinstance(node, Literal) and (node.value is None or isinstance(node.value, bool)):
            return node
        raise self.node_error(node, "a condition")

    def condition(self) -> Node:
        first = self.disjunct()
        operands = [first]
        while self.accept(Kind.KEYWORD, "OR"):
            operands.append(self.disjunct())
        if len(operands) == 1:
            return first
        return Or(tuple(self.as_condition(n) for n in operands), first.position)

    def disjunct(self) -> Node:
        first = self.negation()
        operands = [first]
        while self.accept(Kind.KEYWORD, "AND"):
            operands.append(self.negation())
        if len(operands) == 1:
            return first
        return And(tuple(self.as_condition(n) for n in operands), first.position)

    def negation(self) -> Node:
        token = self.accept(Kind.KEYWORD, "NOT")
        if token is None:
            return self.predicate()
        self.nest(token)
        operand = self.negation()
        self.depth -= 1
        return Not(self.as_condition(operand), token.position)

    def predicate(self) -> Node:
        left = self.operand()
        token = self.peek()
        if token.kind is Kind.OPERATOR and token.text in COMPARISONS:
            self.take()
            return self.comparison(COMPARISONS[token.text], left, self.operand())
        if token.kind is not Kind.KEYWORD:
            return left
        negated = False
        if token.text == "NOT":
            following = self.peek(1)
            if following.kind is not Kind.KEYWORD or following.text not in NEGATABLE:
                self.take()
                raise self.error(following, "BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH")
            self.take()
            negated, token = True, following
        if token.text == "BETWEEN":
            self.take()
            low = self.operand()
            self.expect(Kind.KEYWORD, "AND", "AND between the bounds of BETWEEN")
            return self.between(left, low, self.operand(), negated)
        if token.text == "IN":
            self.take()
            return self.in_list(left, negated)
        if token.text in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
            self.take()
            text = self.take()
            if text.kind is not Kind.STRING:
                raise self.error(text, f"a 'string' after {token.text}")
            return StringMatch(Match(token.text), left, text.text, negated, left.position)
        if token.text == "IS":
            self.take()
            not_null = self.accept(Kind.KEYWORD, "NOT") is not None
            self.expect(Kind.KEYWORD, "NULL", "NULL after IS NOT" if not_null else "NULL or NOT")
            return IsNull(left, not_null, left.position)
        return left

    def comparison(self, op: Compare, left: Node, right: Node) -> Comparison:
        if op in (Compare.EQ, Compare.NE):
            for side in (left, right):
                if isinstance(side, Literal) and side.value is None:
                    raise self.node_error(side, "a value (NULL is tested by IS [NOT] NULL)")
            if (
                isinstance(left, Literal)
                and isinstance(right, Literal)
                and isinstance(left.value, bool) != isinstance(right.value, bool)
            ):
                raise self.node_error(right, f"a value comparable with {describe(left)}")
        else:
            self.check_ordered(left)
            self.check_ordered(right)
        return Comparison(op, left, right, left.position)

    def check_ordered(self, node: Node) -> None:
        """RocketMQ's checkLessThanOperand: < <= > >= and BETWEEN take numbers and properties."""
        if isinstance(node, Literal) and not _is_number(node.value):
            raise self.node_error(node, "a number (only numbers are ordered)")
        if isinstance(node, CONDITIONS):
            raise self.node_error(node, "a number or a property")

    def between(self, value: Node, low: Node, high: Node, negated: bool) -> Between:
        for bound in (low, high):
            if isinstance(bound, Literal) and bound.value is None:
                raise self.node_error(bound, "a number as a bound of BETWEEN, not NULL")
        for node in (value, low, high):
            self.check_ordered(node)
        if isinstance(low, Literal) and isinstance(high, Literal):
            assert isinstance(low.value, int | float) and isinstance(high.value, int | float)
            if low.value > high.value:
                raise self.node_error(
                    high, f"a high bound of at least the low bound, {describe(low)}"
                )
        return Between(value, low, high, negated, value.position)

    def in_list(self, value: Node, negated: bool) -> In:
        if not isinstance(value, Property):
            raise self.node_error(value, "a property before IN")
        self.expect(Kind.OPERATOR, "(", "'(' after IN")
        strings = []
        while True:
            token = self.take()
            if token.kind is not Kind.STRING:
                raise self.error(token, "a 'string' in the IN list")
            strings.append(token.text)
            if self.accept(Kind.OPERATOR, ",") is None:
                break
        self.expect(Kind.OPERATOR, ")", "',' or ')' in the IN list")
        return In(value, frozenset(strings), negated, value.position)

    # --- operands ----------------------------------------------------------------------------

    def operand(self) -> Node:
        token = self.take()
        if token.kind is Kind.IDENTIFIER:
            return Property(token.text, token.position)
        if token.kind in (Kind.INTEGER, Kind.DECIMAL, Kind.STRING):
            return Literal(token.value, token.position)
        if token.kind is Kind.KEYWORD and token.text in ("TRUE", "FALSE", "NULL"):
            constant = {"TRUE": True, "FALSE": False, "NULL": None}[token.text]
            return Literal(constant, token.position)
        if token.kind is Kind.OPERATOR and token.text == "(":
            self.nest(token)
            inner = self.condition()
            self.expect(Kind.OPERATOR, ")", "AND, OR or ')'")
            self.depth -= 1
            return attrs.evolve(inner, position=token.position)  # errors point at the '('

        if token.kind is Kind.OPERATOR and token.text in ("+", "-"):
            self.nest(token)
            inner = self.operand()
            self.depth -= 1
            if not isinstance(inner, Literal) or not _is_number(inner.value):
                raise self.node_error(inner, f"a number after '{token.text}'")
            assert isinstance(inner.value, int | float)
            value = -inner.value if token.text == "-" else inner.value
            return Literal(value, token.position)
        raise self.error(token, OPERAND)
