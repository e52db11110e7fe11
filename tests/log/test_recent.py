"""RecentAppends, the appended batches a store keeps for the read right after, against a list."""

from __future__ import annotations

from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.log.recent import RecentAppends
from dledger.raft.entries import EntryBatch

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.binary(max_size=40), min_size=0, max_size=6)),
        st.tuples(st.just("cut"), st.integers(0, 8)),
        st.tuples(st.just("clear"), st.none()),
        st.tuples(
            st.just("read"), st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 120))
        ),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, bytes_max=st.sampled_from([0, 30, 100, 1000]))
def test_what_is_held_reads_as_the_log_does(ops: list[tuple[str, object]], bytes_max: int) -> None:
    recent = RecentAppends(bytes_max)
    log: list[tuple[int, int, bytes]] = []  # the whole log from index 1: (term, kind, body)
    where: list[int] = []  # each entry's position: 44-byte headers back to back
    for op, arg in ops:
        if op == "add":
            bodies = list(arg)  # type: ignore[call-overload]
            first = len(log) + 1
            terms = [first // 3 + 1] * len(bodies)
            kinds = [k % 3 for k in range(len(bodies))]
            start = where[-1] + 44 + len(log[-1][2]) if log else 0
            positions = list(accumulate((44 + len(b) for b in bodies[:-1]), initial=start))
            recent.add(
                EntryBatch(first, terms, kinds, bodies),
                positions[: len(bodies)],
                list(map(len, bodies)),
            )
            log += zip(terms, kinds, bodies, strict=True)
            where += positions[: len(bodies)]
        elif op == "cut":
            index = max(0, len(log) - int(arg))  # type: ignore[call-overload]
            recent.cut_after(index)
            del log[index:]
            del where[index:]
        elif op == "clear":
            recent.clear()
        else:
            lo, span, budget = arg  # type: ignore[misc]
            lo = max(1, lo)
            hi = lo + span // 4
            got = recent.read(lo, hi, budget)
            held_positions = recent.positions(lo, hi)
            assert (got is None) == (held_positions is None)
            if got is None:
                continue
            assert held_positions == where[lo - 1 : hi]
            assert hi <= len(log)
            assert got.first_index == lo and 1 <= len(got) <= hi - lo + 1
            want = log[lo - 1 : lo - 1 + len(got)]
            assert list(got.terms) == [w[0] for w in want]
            assert list(got.kinds) == [w[1] for w in want]
            assert list(got.payloads) == [w[2] for w in want]
            total = sum(map(len, got.payloads))
            assert len(got) == 1 or total <= budget
            if len(got) < hi - lo + 1:  # stopped early: the next would not have fit
                assert total + len(log[lo - 1 + len(got)][2]) > budget


def test_the_newest_batches_stay_within_the_bound() -> None:
    recent = RecentAppends(10)
    for n in range(1, 6):
        recent.add(EntryBatch(n, [1], [0], [b"x" * 4]), [48 * (n - 1)], [4])
    assert recent.read(1, 5, 100) is None  # the oldest went
    held = recent.read(4, 5, 100)
    assert held is not None and list(held.payloads) == [b"xxxx", b"xxxx"]


def test_a_mutable_buffer_is_not_held() -> None:
    recent = RecentAppends(100)
    recent.add(EntryBatch(1, [1], [0], [b"a"]), [0], [1])
    recent.add(EntryBatch(2, [1], [0], [bytearray(b"b")]), [45], [1])  # type: ignore[list-item]
    assert recent.read(1, 1, 100) is None and recent.read(2, 2, 100) is None
