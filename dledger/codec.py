"""Raft messages to msgpack maps and back (docs/protocol.md lists every field).

Entry batches travel as three parallel lists (terms, kinds, bodies), so encoding and decoding
a batch is a few C calls whatever its length. Decoding checks every field it reads and raises
MalformedFrame naming the field; it never trusts a peer's types.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dledger.raft.entries import EntryBatch, EntryId, LogStart
from dledger.raft.membership import ConfigEntry, Membership
from dledger.raft.messages import (
    AppendEntries,
    AppendEntriesReply,
    Heartbeat,
    HeartbeatReply,
    InstallLogStart,
    Message,
    RequestVote,
    RequestVoteReply,
    TimeoutNow,
)
from dledger.wire import Code, MalformedFrame, code_of, field


def _entry_id(e: EntryId) -> list[int]:
    return [e.index, e.term]


def _read_entry_id(body: dict[str, Any], name: str) -> EntryId:
    pair = field(body, name, list)
    if len(pair) != 2 or not all(isinstance(x, int) and x >= 0 for x in pair):
        raise MalformedFrame(f"field {name!r} must be [index, term]")
    return EntryId(pair[0], pair[1])


def _read_term(body: dict[str, Any]) -> int:
    return _read_non_negative(body, "term")


def _read_non_negative(body: dict[str, Any], name: str) -> int:
    value = field(body, name, int)
    if value < 0:
        raise MalformedFrame(f"field {name!r} must be >= 0")
    return value


def encode_message(m: Message) -> dict[str, Any]:
    t = type(m)
    if t is AppendEntries:
        assert isinstance(m, AppendEntries)
        e = m.entries
        return {
            "c": Code.APPEND_ENTRIES,
            "term": m.term,
            "from": m.leader,
            "prev": _entry_id(m.prev),
            "commit": m.commit,
            "first": e.first_index,
            "terms": list(e.terms),
            "kinds": list(e.kinds),
            "bodies": list(e.payloads),
        }
    if t is AppendEntriesReply:
        assert isinstance(m, AppendEntriesReply)
        return {
            "c": Code.APPEND_ENTRIES_REPLY,
            "term": m.term,
            "from": m.follower,
            "ok": m.success,
            "match": m.match_index,
            "reject": m.reject_index,
            "hint": _entry_id(m.hint) if m.hint is not None else None,
        }
    if t is Heartbeat:
        assert isinstance(m, Heartbeat)
        return {"c": Code.HEARTBEAT, "term": m.term, "from": m.leader, "commit": m.commit}
    if t is HeartbeatReply:
        assert isinstance(m, HeartbeatReply)
        return {"c": Code.HEARTBEAT_REPLY, "term": m.term, "from": m.follower, "end": m.log_end}
    if t is RequestVote:
        assert isinstance(m, RequestVote)
        return {
            "c": Code.REQUEST_VOTE,
            "term": m.term,
            "from": m.candidate,
            "last": _entry_id(m.last_log),
            "pre": m.pre_vote,
            "transfer": m.transfer,
        }
    if t is RequestVoteReply:
        assert isinstance(m, RequestVoteReply)
        return {
            "c": Code.REQUEST_VOTE_REPLY,
            "term": m.term,
            "from": m.voter,
            "granted": m.granted,
            "pre": m.pre_vote,
            "removed": m.removed_at,
            "removed_term": m.removed_term,
        }
    if t is TimeoutNow:
        assert isinstance(m, TimeoutNow)
        return {"c": Code.TIMEOUT_NOW, "term": m.term, "from": m.leader}
    assert t is InstallLogStart, t
    assert isinstance(m, InstallLogStart)
    cfg = m.config
    return {
        "c": Code.INSTALL_LOG_START,
        "term": m.term,
        "from": m.leader,
        "prev": _entry_id(m.start.prev),
        "position": m.start.position,
        "commit": m.commit,
        "config": [
            cfg.index,
            cfg.term,
            sorted(cfg.membership.voters),
            sorted(cfg.membership.learners),
        ],
    }


_BYTES, _INT = {bytes}, {int}


def _decode_append(b: dict[str, Any], sender: str) -> Message:
    terms, kinds, bodies = (
        field(b, "terms", list),
        field(b, "kinds", list),
        field(b, "bodies", list),
    )
    if not len(terms) == len(kinds) == len(bodies):
        raise MalformedFrame("terms, kinds and bodies differ in length")
    first = field(b, "first", int)
    prev = _read_entry_id(b, "prev")
    if first != prev.index + 1:
        raise MalformedFrame(f"first entry {first} does not follow prev {prev.index}")
    if bodies:  # a follower checks every entry it is sent: C-level maps, not generators
        if set(map(type, bodies)) != _BYTES:
            raise MalformedFrame("bodies must all be bytes")
        if set(map(type, terms)) != _INT or set(map(type, kinds)) != _INT:
            raise MalformedFrame("terms and kinds must all be integers")
    commit = field(b, "commit", int)
    return AppendEntries(
        _read_term(b), sender, prev, EntryBatch(first, terms, kinds, bodies), commit
    )


def _decode_append_reply(b: dict[str, Any], sender: str) -> Message:
    hint = None if b.get("hint") is None else _read_entry_id(b, "hint")
    return AppendEntriesReply(
        _read_term(b),
        sender,
        field(b, "ok", bool),
        field(b, "match", int),
        field(b, "reject", int),
        hint,
    )


def _decode_install(b: dict[str, Any], sender: str) -> Message:
    row = field(b, "config", list)
    if len(row) != 4 or not isinstance(row[2], list) or not isinstance(row[3], list):
        raise MalformedFrame("field 'config' must be [index, term, voters, learners]")
    try:
        config = ConfigEntry(row[0], row[1], Membership(frozenset(row[2]), frozenset(row[3])))
    except (AssertionError, TypeError) as err:
        raise MalformedFrame(f"field 'config': {err}") from err
    start = LogStart(_read_entry_id(b, "prev"), field(b, "position", int))
    return InstallLogStart(_read_term(b), sender, start, field(b, "commit", int), config)


_DECODERS: dict[Code, Callable[[dict[str, Any], str], Message]] = {
    Code.APPEND_ENTRIES: _decode_append,
    Code.APPEND_ENTRIES_REPLY: _decode_append_reply,
    Code.HEARTBEAT: lambda b, s: Heartbeat(_read_term(b), s, field(b, "commit", int)),
    Code.HEARTBEAT_REPLY: lambda b, s: HeartbeatReply(_read_term(b), s, field(b, "end", int)),
    Code.REQUEST_VOTE: lambda b, s: RequestVote(
        _read_term(b),
        s,
        _read_entry_id(b, "last"),
        field(b, "pre", bool),
        field(b, "transfer", bool),
    ),
    Code.REQUEST_VOTE_REPLY: lambda b, s: RequestVoteReply(
        _read_term(b),
        s,
        field(b, "granted", bool),
        field(b, "pre", bool),
        _read_non_negative(b, "removed") if "removed" in b else 0,
        _read_non_negative(b, "removed_term") if "removed_term" in b else 0,
    ),
    Code.TIMEOUT_NOW: lambda b, s: TimeoutNow(_read_term(b), s),
    Code.INSTALL_LOG_START: _decode_install,
}

RAFT_CODES = frozenset(_DECODERS)


def decode_message(body: dict[str, Any], *, sender: str) -> Message:
    """A Raft message from `sender` (the peer named in the connection's HELLO: a peer cannot
    speak for another through its "from" field)."""
    code = code_of(body)
    decoder = _DECODERS.get(code)
    if decoder is None:
        raise MalformedFrame(f"code {code.name} is not a Raft message")
    claimed = field(body, "from", str)
    if claimed != sender:
        raise MalformedFrame(f"message from {claimed!r} on the connection of {sender!r}")
    return decoder(body, sender)
