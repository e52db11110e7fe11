"""Frames and the message codec: round trips, and what a bad peer can send."""

from __future__ import annotations

import attrs
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger import limits
from dledger.codec import decode_message, encode_message
from dledger.raft.entries import EntryBatch, EntryId, LogStart
from dledger.raft.membership import ConfigEntry, Membership
from dledger.raft.messages import (
    AppendEntries,
    AppendEntriesReply,
    Heartbeat,
    HeartbeatReply,
    InstallLogStart,
    RequestVote,
    RequestVoteReply,
    TimeoutNow,
)
from dledger.wire import LENGTH, FrameReader, FrameTooLarge, MalformedFrame, encode_frame

ids = st.sampled_from(["n0", "n1", "n2"])
terms = st.integers(0, 2**40)
entry_ids = st.builds(EntryId, st.integers(0, 2**40), terms)


@st.composite
def batches(draw: st.DrawFn) -> tuple[EntryId, EntryBatch]:
    prev = draw(entry_ids)
    n = draw(st.integers(0, 20))
    b = EntryBatch(
        prev.index + 1,
        draw(st.lists(terms, min_size=n, max_size=n)),
        draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)),
        draw(st.lists(st.binary(max_size=200), min_size=n, max_size=n)),
    )
    return prev, b


@st.composite
def messages(draw: st.DrawFn) -> object:
    kind = draw(st.integers(0, 7))
    t, s = draw(terms), draw(ids)
    if kind == 0:
        prev, b = draw(batches())
        return AppendEntries(t, s, prev, b, draw(st.integers(0, 2**40)))
    if kind == 1:
        return AppendEntriesReply(
            t,
            s,
            draw(st.booleans()),
            draw(st.integers(0, 2**40)),
            draw(st.integers(0, 2**40)),
            draw(st.none() | entry_ids),
        )
    if kind == 2:
        return Heartbeat(t, s, draw(st.integers(0, 2**40)))
    if kind == 3:
        return HeartbeatReply(t, s)
    if kind == 4:
        return RequestVote(t, s, draw(entry_ids), draw(st.booleans()), draw(st.booleans()))
    if kind == 5:
        return RequestVoteReply(
            t,
            s,
            draw(st.booleans()),
            draw(st.booleans()),
            draw(st.integers(0, 2**40)),
            draw(st.integers(0, 2**40)),
        )
    if kind == 6:
        return TimeoutNow(t, s)
    config = ConfigEntry(3, 1, Membership(frozenset({"n0", "n1"}), frozenset({"n2"})))
    return InstallLogStart(
        t,
        s,
        LogStart(draw(entry_ids), draw(st.integers(0, 2**40))),
        draw(st.integers(0, 2**40)),
        config,
    )


def _normalised(m: object) -> object:
    if isinstance(m, AppendEntries):  # lists come back as lists; compare contents
        e = m.entries
        return (
            m.term,
            m.leader,
            m.prev,
            m.commit,
            e.first_index,
            list(e.terms),
            list(e.kinds),
            list(e.payloads),
        )
    return m


@given(messages())
def test_every_message_round_trips_through_a_frame(m: object) -> None:
    reader = FrameReader()
    reader.feed(encode_frame(encode_message(m)))  # type: ignore[arg-type]
    (body,) = list(reader.frames())
    assert _normalised(decode_message(body, sender=m.sender)) == _normalised(m)  # type: ignore[attr-defined]


@given(
    st.lists(
        st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3),
        min_size=1,
        max_size=5,
    ),
    st.integers(1, 7),
)
def test_frames_split_anywhere_come_out_whole(bodies: list[dict[str, int]], chunk: int) -> None:
    stream = b"".join(encode_frame(b) for b in bodies)
    reader = FrameReader()
    out = []
    for i in range(0, len(stream), chunk):
        reader.feed(stream[i : i + chunk])
        out.extend(reader.frames())
    assert out == bodies
    assert reader.buffered == 0


class TestBadFrames:
    def test_length_over_the_limit_is_refused_before_reading_the_body(self) -> None:
        reader = FrameReader()
        reader.feed(LENGTH.pack(limits.FRAME_BYTES_MAX + 1))
        with pytest.raises(FrameTooLarge, match=f"exceeds the limit of {limits.FRAME_BYTES_MAX}"):
            list(reader.frames())

    def test_garbage_is_malformed(self) -> None:
        reader = FrameReader()
        reader.feed(LENGTH.pack(3) + b"\xc1\xc1\xc1")
        with pytest.raises(MalformedFrame, match="not msgpack"):
            list(reader.frames())

    def test_a_frame_must_hold_a_map(self) -> None:
        reader = FrameReader()
        payload = msgpack.packb([1, 2])
        reader.feed(LENGTH.pack(len(payload)) + payload)
        with pytest.raises(MalformedFrame, match="expected a map, got list"):
            list(reader.frames())

    def test_field_of_wrong_type_is_named(self) -> None:
        body = encode_message(Heartbeat(1, "n0", 5))
        body["commit"] = "five"
        with pytest.raises(MalformedFrame, match="field 'commit' must be int, got str"):
            decode_message(body, sender="n0")

    def test_missing_field_is_named(self) -> None:
        body = encode_message(HeartbeatReply(1, "n0"))
        del body["term"]
        with pytest.raises(MalformedFrame, match="missing field 'term'"):
            decode_message(body, sender="n0")

    def test_unknown_code(self) -> None:
        with pytest.raises(MalformedFrame, match="unknown message code 9999"):
            decode_message({"c": 9999, "from": "n0"}, sender="n0")

    def test_peer_cannot_speak_for_another(self) -> None:
        body = encode_message(HeartbeatReply(1, "n1"))
        with pytest.raises(MalformedFrame, match="from 'n1' on the connection of 'n0'"):
            decode_message(body, sender="n0")

    def test_batch_lists_must_agree(self) -> None:
        body = encode_message(
            AppendEntries(1, "n0", EntryId(0, 0), EntryBatch(1, [1], [0], [b"x"]), 0)
        )
        body["kinds"] = []
        with pytest.raises(MalformedFrame, match="differ in length"):
            decode_message(body, sender="n0")

    def test_bodies_must_be_bytes(self) -> None:
        body = encode_message(
            AppendEntries(1, "n0", EntryId(0, 0), EntryBatch(1, [1], [0], [b"x"]), 0)
        )
        body["bodies"] = ["text"]
        with pytest.raises(MalformedFrame, match="bodies must all be bytes"):
            decode_message(body, sender="n0")

    @pytest.mark.parametrize(
        "field, values",
        [("terms", [1, "1"]), ("terms", [True, 1]), ("kinds", [0, 1.0]), ("kinds", [None, 0])],
    )
    def test_terms_and_kinds_must_be_integers(self, field: str, values: list[object]) -> None:
        batch = EntryBatch(1, [1, 1], [0, 0], [b"x", b"y"])
        body = encode_message(AppendEntries(1, "n0", EntryId(0, 0), batch, 0))
        body[field] = values
        with pytest.raises(MalformedFrame, match="terms and kinds must all be integers"):
            decode_message(body, sender="n0")
        body[field] = [1, 1]
        assert decode_message(body, sender="n0").entries.payloads == [b"x", b"y"]

    def test_removed_at_is_optional_but_never_negative(self) -> None:
        """A reply from a replica that predates the fields decodes as an ordinary refusal."""
        reply = RequestVoteReply(3, "n1", False, True, removed_at=7, removed_term=2)
        body = encode_message(reply)
        del body["removed"], body["removed_term"]
        plain = attrs.evolve(reply, removed_at=0, removed_term=0)
        assert decode_message(dict(body), sender="n1") == plain
        for key in ("removed", "removed_term"):
            bad = {**encode_message(reply), key: -1}
            with pytest.raises(MalformedFrame, match=f"field '{key}' must be >= 0"):
                decode_message(bad, sender="n1")
