"""The tree an SQL92 filter expression parses to (parser.py builds it, compiler.py runs it).

Nodes are frozen and compare by value, so tests can check what an expression means apart
from how it was written. `position` is where the node's text starts (for error messages);
it takes no part in equality.
"""

from __future__ import annotations

import enum

import attrs

Constant = int | float | str | bool | None


class Compare(enum.Enum):
    EQ = "="
    NE = "<>"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


class Match(enum.Enum):
    """String tests of RocketMQ 5: `a CONTAINS 'x'`, `a STARTSWITH 'x'`, `a ENDSWITH 'x'`."""

    CONTAINS = "CONTAINS"
    STARTSWITH = "STARTSWITH"
    ENDSWITH = "ENDSWITH"


@attrs.frozen
class Literal:
    value: Constant
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class Property:
    name: str
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class Comparison:
    op: Compare
    left: Node
    right: Node
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class Between:
    value: Node
    low: Node
    high: Node
    negated: bool = False
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class In:
    value: Property  # RocketMQ: "Expected a property for In expression"
    strings: frozenset[str]
    negated: bool = False
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class IsNull:
    value: Node
    negated: bool = False  # IS NOT NULL
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class StringMatch:
    kind: Match
    value: Node
    text: str
    negated: bool = False
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class Not:
    operand: Node
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class And:
    operands: tuple[Node, ...]  # two or more, flattened: a AND b AND c is one node
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class Or:
    operands: tuple[Node, ...]
    position: int = attrs.field(default=0, eq=False)


@attrs.frozen
class Truth:
    """A bare property where a condition is expected (`WHERE flag`): its value read as a
    boolean, as RocketMQ's boolean cast."""

    value: Property
    position: int = attrs.field(default=0, eq=False)


Node = (
    Literal | Property | Comparison | Between | In | IsNull | StringMatch | Not | And | Or | Truth
)

# Nodes whose value is TRUE, FALSE or unknown: what AND, OR, NOT and the whole filter take.
CONDITIONS = (Comparison, Between, In, IsNull, StringMatch, Not, And, Or, Truth)
