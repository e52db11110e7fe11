"""The pure halves of transactions: the pending halves as operations are applied
(broker/transaction_progress.py), and the shaper's memory of what must enter the log once
(broker/shaped_once.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from broker.entries import encode_meta
from broker.schedule_progress import DeliveryProgress
from broker.shaped_once import ShapedOnce
from broker.transaction_progress import HOW_ROLLBACK, TransactionProgress
from broker.transactions import immunity_ms_of
from remoting import properties as props

OFFSETS = st.integers(0, 12)


@st.composite
def operations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Halves arriving in order, with ends and numbered checks among them."""
    ops: list[dict[str, Any]] = []
    halves = 0
    counts: dict[int, int] = {}
    for step in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(("half", "end", "check")))
        if kind == "half" or halves == 0:
            immunity = draw(st.none() | st.integers(0, 10**6))
            ops.append(TransactionProgress.half_op(halves, 1000 + step, immunity))
            halves += 1
        elif kind == "end":
            ops.append(TransactionProgress.end_op(draw(st.integers(0, halves - 1)), HOW_ROLLBACK))
        else:
            chosen = draw(st.sets(st.integers(0, halves - 1), min_size=1))
            numbers = {o: counts.get(o, 0) + 1 for o in chosen}
            counts.update(numbers)
            ops.append(TransactionProgress.check_op(numbers, 5000 + step))
    return ops


@given(operations())
def test_applying_again_changes_nothing_and_the_state_round_trips(
    ops: list[dict[str, Any]],
) -> None:
    once, twice = TransactionProgress(), TransactionProgress()
    for op in ops:
        once.apply(op)
        twice.apply(op)
        twice.apply(op)
    assert once.state() == twice.state()
    restored = TransactionProgress()
    restored.restore(once.state())
    assert restored.state() == once.state()
    ended = {op["offset"] for op in ops if op["op"] == "txn_end"}
    assert set(once.pending) == set(range(once.end)) - ended
    for offset in range(once.end + 2):
        assert once.resolved(offset) == (offset in ended and offset < once.end)


def test_checks_count_and_record_their_time() -> None:
    progress = TransactionProgress()
    progress.apply(TransactionProgress.half_op(0, 100))
    progress.apply(TransactionProgress.check_op({0: 1, 7: 1}, 200))  # 7: no such half
    progress.apply(TransactionProgress.check_op({0: 2}, 300))
    progress.apply(TransactionProgress.check_op({0: 1}, 400))  # an older one again: nothing
    half = progress.pending[0]
    assert (half.store_ms, half.checks, half.last_check_ms) == (100, 2, 300)
    assert list(progress.pending) == [0]


def test_a_halfs_immunity_is_read_from_its_properties_and_kept() -> None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS (seconds) as ms; none, or not a count: None."""
    assert immunity_ms_of(props.encode({"CHECK_IMMUNITY_TIME_IN_SECONDS": "30"})) == 30_000
    assert immunity_ms_of(props.encode({"CHECK_IMMUNITY_TIME_IN_SECONDS": "0"})) == 0
    for bad in ("-1", "abc", "1.5", "9" * 10):
        assert immunity_ms_of(props.encode({"CHECK_IMMUNITY_TIME_IN_SECONDS": bad})) is None
    assert immunity_ms_of(props.encode({"UNIQ_KEY": "u"})) is None
    progress = TransactionProgress()
    progress.apply(TransactionProgress.half_op(0, 100, 30_000))
    progress.apply(TransactionProgress.half_op(1, 100))
    assert progress.pending[0].immunity_ms == 30_000 and progress.pending[1].immunity_ms is None
    older = {"end": 1, "pending": [[0, 100, 2, 300]]}  # a checkpoint written before immunity
    progress.restore(older)
    assert progress.pending[0].immunity_ms is None and progress.state() == older


def commit_properties(half: int) -> bytes:
    return props.encode({"UNIQ_KEY": "u", "TRAN_HALF_OFFSET": str(half)})


def test_a_commit_is_first_once_until_refused() -> None:
    progress = TransactionProgress()
    for offset in range(3):
        progress.apply(TransactionProgress.half_op(offset, 0))
    progress.apply(TransactionProgress.end_op(1, HOW_ROLLBACK))
    once = ShapedOnce()
    once.begin()
    assert once.first_commit(commit_properties(0), progress, 3)
    assert not once.first_commit(commit_properties(0), progress, 3)  # shaped already
    assert not once.first_commit(commit_properties(1), progress, 3)  # rolled back
    assert once.first_commit(commit_properties(4), progress, 5)  # shaped, not applied yet
    assert not once.first_commit(commit_properties(5), progress, 5)  # no such half
    once.refused()  # that proposal never entered the log
    once.begin()
    assert once.first_commit(commit_properties(0), progress, 3)
    once.resolved(0)  # applied: the progress has it from now on
    assert once.halves == set()
    once.begin()
    once.note_resolution(encode_meta(TransactionProgress.end_op(2, HOW_ROLLBACK)))
    assert not once.first_commit(commit_properties(2), progress, 3)  # a rollback went first
    plain = props.encode({"K": "TRAN_HALF_OFFSET"})  # the name, not as a key
    assert once.first_commit(plain, progress, 3)
    assert once.first_delivery(props.encode({"K": "SCHEDULE_SOURCE"}), DeliveryProgress())
    once.clear()
    assert once.halves == set() and once.sources == set()
