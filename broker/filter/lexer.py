"""Tokens of RocketMQ's SQL92 filter language (its filter module's SelectorParser.jj).

    keywords     NOT AND OR BETWEEN IN IS NULL TRUE FALSE CONTAINS STARTSWITH ENDSWITH
                 (any case; a keyword is never an identifier)
    identifier   [A-Za-z_$][A-Za-z0-9_$]*          case-sensitive: a property name
    integer      [0-9]+ with an optional l/L suffix, within a Java long (< 2^63)
    decimal      5.5  5.  .5  5e10  5.5E-3          a finite double
    string       'it''s'                            '' is one quote; any other character as is
    operators    = <> < <= > >= ( ) , + -
    whitespace   space, tab, CR, LF, FF;  comments -- to the end of the line, /* ... */

Each token keeps its character offset, so every error names where it is.
"""

from __future__ import annotations

import enum
import re

import attrs

from broker.filter.errors import FilterSyntaxError

INTEGER_MAX = (1 << 63) - 1  # a Java long, as RocketMQ's ConstantExpression.createFromDecimal

KEYWORDS = frozenset(
    {
        "NOT",
        "AND",
        "OR",
        "BETWEEN",
        "IN",
        "IS",
        "NULL",
        "TRUE",
        "FALSE",
        "CONTAINS",
        "STARTSWITH",
        "ENDSWITH",
    }
)
OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")  # longest first


class Kind(enum.Enum):
    KEYWORD = "keyword"  # text: the keyword in upper case
    IDENTIFIER = "identifier"
    INTEGER = "integer"
    DECIMAL = "decimal"
    STRING = "string"
    OPERATOR = "operator"
    END = "end"


@attrs.frozen
class Token:
    kind: Kind
    text: str  # keywords upper-cased; a string's decoded value; an operator's symbol
    value: int | float | str | None  # the constant of a number or string token
    position: int  # character offset of the token's first character

    def describe(self) -> str:
        """How an error names this token."""
        if self.kind is Kind.END:
            return "the end of the expression"
        if self.kind is Kind.STRING:
            return "'" + self.text.replace("'", "''") + "'"
        if self.kind is Kind.IDENTIFIER:
            return f"property {self.text}"
        if self.kind is Kind.OPERATOR:
            return f"'{self.text}'"
        return self.text  # a keyword, a number


_SPACE = " \t\r\n\f"
_WORD = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*", re.ASCII)
_NUMBER = re.compile(
    r"(?P<decimal>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
    r"|[0-9]+[eE][+-]?[0-9]+)|(?P<integer>[0-9]+)[lL]?",
    re.ASCII,
)


def tokenize(expression: str) -> list[Token]:
    """The tokens of `expression`, ending with one END token. Raises FilterSyntaxError."""
    tokens: list[Token] = []
    at, end = 0, len(expression)
    while True:
        at = _skip_space_and_comments(expression, at)
        if at >= end:
            tokens.append(Token(Kind.END, "", None, end))
            return tokens
        char = expression[at]
        if char == "'":
            token = _string(expression, at)
        elif char.isascii() and (char.isdigit() or char == "."):
            token = _number(expression, at)
        elif (word := _WORD.match(expression, at)) is not None:
            text = word.group()
            upper = text.upper()
            if upper in KEYWORDS:
                token = Token(Kind.KEYWORD, upper, None, at)
            else:
                token = Token(Kind.IDENTIFIER, text, None, at)
        else:
            symbol = next((op for op in OPERATORS if expression.startswith(op, at)), None)
            if symbol is None:
                expected = "<> (not equal)" if expression.startswith("!=", at) else "a token"
                raise FilterSyntaxError(expression, at, expected, f"{char!r}")
            token = Token(Kind.OPERATOR, symbol, None, at)
        tokens.append(token)
        at = token.position + _length(expression, token)


def _length(expression: str, token: Token) -> int:
    if token.kind is Kind.STRING:
        return 2 + len(token.text) + token.text.count("'")
    if token.kind in (Kind.INTEGER, Kind.DECIMAL):
        match = _NUMBER.match(expression, token.position)
        assert match is not None
        return match.end() - token.position
    return len(token.text)


def _skip_space_and_comments(expression: str, at: int) -> int:
    end = len(expression)
    while at < end:
        if expression[at] in _SPACE:
            at += 1
        elif expression.startswith("--", at):
            newline = min(
                (i for i in (expression.find("\n", at), expression.find("\r", at)) if i >= 0),
                default=end,
            )
            at = newline
        elif expression.startswith("/*", at):
            close = expression.find("*/", at + 2)
            if close < 0:
                raise FilterSyntaxError(expression, at, "*/ closing this comment", "the end")
            at = close + 2
        else:
            break
    return at


def _string(expression: str, at: int) -> Token:
    parts = []
    i = at + 1
    while True:
        close = expression.find("'", i)
        if close < 0:
            raise FilterSyntaxError(
                expression, at, "a closing quote for this string", "the end of the expression"
            )
        parts.append(expression[i:close])
        if expression.startswith("''", close):
            parts.append("'")
            i = close + 2
        else:
            text = "".join(parts)
            return Token(Kind.STRING, text, text, at)


def _number(expression: str, at: int) -> Token:
    match = _NUMBER.match(expression, at)
    if match is None:  # a lone "."
        raise FilterSyntaxError(expression, at, "a digit after '.'", repr(expression[at]))
    text = match.group()
    if match.group("integer") is not None:
        value = int(match.group("integer"))
        if value > INTEGER_MAX:
            raise FilterSyntaxError(
                expression, at, f"an integer of at most {INTEGER_MAX} (a Java long)", text
            )
        return Token(Kind.INTEGER, text, value, at)
    number = float(text)
    if number == float("inf"):
        raise FilterSyntaxError(expression, at, "a decimal within a double's range", text)
    return Token(Kind.DECIMAL, text, number, at)
