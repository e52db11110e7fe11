"""Broker-side message filters (docs/filtering.md).

A subscription is TAG (`TagA || TagB`, matched by the tag hash in the ConsumeQueue) or SQL92
(a predicate over a message's properties, matched on the stored record). `subscription.py`
turns (expressionType, expression) into a `SubscriptionFilter` once and caches it; the SQL92
grammar is `lexer.py` -> `parser.py` (a small tree, `syntax.py`) -> `compiler.py` (closures).
"""
