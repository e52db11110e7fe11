"""Errors of filter expressions: each says where (a character offset) and what was wrong."""

from __future__ import annotations

import attrs


class FilterError(ValueError):
    """Base of the reasons a subscription's expression is refused."""


@attrs.define
class FilterSyntaxError(FilterError):
    """An SQL92 expression we do not accept: at `position` (0-based character offset into
    `expression`) we wanted `expected` and found `found`. Grammar and meaning errors alike
    (a bad token, NULL in a comparison, a BETWEEN whose bounds are reversed)."""

    expression: str
    position: int
    expected: str
    found: str

    def __str__(self) -> str:
        return (
            f"SQL92 syntax error at character {self.position}: "
            f"expected {self.expected}, found {self.found}"
        )


@attrs.define
class UnknownExpressionType(FilterError):
    """A subscription's expressionType is neither TAG nor SQL92."""

    expression_type: str

    def __str__(self) -> str:
        return f"unknown expressionType {self.expression_type!r} (TAG or SQL92)"


@attrs.define
class FilterTooLarge(FilterError):
    """An expression past EXPRESSION_CHARS_MAX characters."""

    length: int
    limit: int

    def __str__(self) -> str:
        return f"the expression has {self.length} characters; at most {self.limit} are accepted"
