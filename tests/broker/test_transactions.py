"""Transactional messages (broker/transactions.py, end_transaction.py, transaction_check.py)
against one in-process group on 127.0.0.1, with transactionTimeOut and transactionCheckInterval
shortened by configuration. Producers are raw remoting connections that heartbeat their group
and answer CHECK_TRANSACTION_STATE as the Java client does (END_TRANSACTION one-way, with
fromTransactionCheck, to the broker the check came from).

What must hold: a half message is invisible in its topic; a commit makes it visible once, however
often it is repeated and wherever it is sent; a rollback never; an unresolved half is checked
back after the timeout, then every interval, with a live producer of its group (another one when
the first is gone), at most transactionCheckMax times, then discarded; transactional sends that
ask for a delay or come in a batch are refused.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from broker.context import Broker
from broker.transactions import COMMIT, HALF_OFFSET, HALF_TOPIC, NOT_TYPE, ROLLBACK
from client import batch
from remoting import properties as props
from remoting import stored_message
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from remoting.message_id import offset_msg_id, parse_offset_msg_id
from remoting.stored_message import StoredMessage
from tests.broker import rmq
from tests.broker.group import Group, broker_group

TOPIC = "Payments"
PRODUCER_GROUP = "pg_tx"
TIMEOUT_MS = 300
INTERVAL_MS = 300
CHECK_MAX = 3
CONFIG = {
    "transaction_timeout_ms": TIMEOUT_MS,
    "transaction_check_interval_ms": INTERVAL_MS,
    "transaction_check_max": CHECK_MAX,
}
WAIT_S = 10.0


@attrs.frozen
class Half:
    """What the answer to a half message's send says."""

    uniq_key: str
    offset_msg_id: str
    queue_offset: int  # in RMQ_SYS_TRANS_HALF_TOPIC: END_TRANSACTION's tranStateTableOffset
    queue_id: int
    transaction_id: str | None

    @property
    def physical_offset(self) -> int:
        return parse_offset_msg_id(self.offset_msg_id)[1]


async def send_half(
    conn: Connection,
    uniq_key: str,
    body: bytes = b"pay",
    *,
    queue_id: int = 1,
    group: str = PRODUCER_GROUP,
    **extra: str,
) -> Half:
    text = rmq.properties(TRAN_MSG="true", PGROUP=group, UNIQ_KEY=uniq_key, KEYS=uniq_key, **extra)
    response = await rmq.send(conn, TOPIC, queue_id, body, props=text)
    assert response.code == ResponseCode.SUCCESS, response.remark
    fields = response.ext_fields
    return Half(
        uniq_key,
        fields["msgId"],
        int(fields["queueOffset"]),
        int(fields["queueId"]),
        fields.get("transactionId"),
    )


def end_request(
    half: Half | CheckTransactionStateRequestHeader,
    how: int,
    *,
    group: str = PRODUCER_GROUP,
    from_check: bool = False,
    oneway: bool = False,
) -> RemotingCommand:
    if isinstance(half, Half):
        queue_offset, physical, uniq = half.queue_offset, half.physical_offset, half.uniq_key
    else:
        queue_offset, physical = half.tran_state_table_offset, half.commit_log_offset
        uniq = half.msg_id or ""
    header = EndTransactionRequestHeader(
        producer_group=group,
        tran_state_table_offset=queue_offset,
        commit_log_offset=physical,
        commit_or_rollback=how,
        from_transaction_check=from_check,
        msg_id=uniq,
        transaction_id=uniq,
    )
    return RemotingCommand.request(RequestCode.END_TRANSACTION, header.encode(), oneway=oneway)


async def end(conn: Connection, half: Half, how: int) -> RemotingCommand:
    return await conn.request(end_request(half, how), timeout_s=10.0)


@attrs.define
class Producer:
    """A producer of a group on one connection: it records the checks it gets and answers each
    with `answer(header)`'s state (None: no answer at all)."""

    client_id: str
    answer: Callable[[CheckTransactionStateRequestHeader], int | None]
    checks: list[tuple[float, CheckTransactionStateRequestHeader, StoredMessage]] = attrs.field(
        factory=list
    )
    arrived: trio.Event = attrs.field(factory=trio.Event)
    conn: Connection | None = None

    async def handle(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        assert request.code == RequestCode.CHECK_TRANSACTION_STATE, request.code
        assert request.is_oneway
        header = CheckTransactionStateRequestHeader.decode(request.ext_fields)
        message = stored_message.decode(request.body)
        self.checks.append((trio.current_time(), header, message))
        self.arrived.set()
        self.arrived = trio.Event()
        how = self.answer(header)
        if how is not None:  # the Java client answers one-way, to the broker that asked
            await conn.send_oneway(end_request(header, how, from_check=True))
        return request.response(ResponseCode.SUCCESS)

    async def wait_checks(self, count: int, timeout_s: float = WAIT_S) -> None:
        with trio.fail_after(timeout_s):
            while len(self.checks) < count:
                await self.arrived.wait()


@asynccontextmanager
async def producer(
    broker: Broker,
    client_id: str,
    answer: Callable[[CheckTransactionStateRequestHeader], int | None],
    group: str = PRODUCER_GROUP,
) -> AsyncIterator[Producer]:
    """A producer connected to `broker`, registered there by a heartbeat."""
    p = Producer(client_id, answer)
    async with open_connection("127.0.0.1", broker.config.listen.port, handler=p.handle) as conn:
        p.conn = conn
        body = {"clientID": client_id, "producerDataSet": [{"groupName": group}]}
        beat = RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(body).encode())
        assert (await conn.request(beat)).code == ResponseCode.SUCCESS
        yield p


async def pull_all(conn: Connection, topic: str, queue_id: int) -> list[StoredMessage]:
    response, messages = await rmq.pull(conn, topic, queue_id, 0)
    assert response.code in (
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.TOPIC_NOT_EXIST,
    ), response.remark
    return messages


async def wait_visible(conn: Connection, queue_id: int, count: int) -> list[StoredMessage]:
    with trio.fail_after(WAIT_S):
        while True:
            messages = await pull_all(conn, TOPIC, queue_id)
            if len(messages) >= count:
                return messages
            await trio.sleep(0.02)


async def wait_resolved(group: Group, half: Half) -> None:
    """Until every replica has applied the half's resolution."""
    with trio.fail_after(WAIT_S):
        while not all(
            b.state.metadata.transactions.resolved(half.queue_offset)
            for b in group.brokers.values()
        ):
            await trio.sleep(0.02)
    await group.wait_applied_everywhere()


def real_messages(group: Group, queue_id: int) -> dict[str, list[StoredMessage]]:
    """Each replica's messages in TOPIC's queue, from its own state."""
    out = {}
    for name, broker in group.brokers.items():
        lo, hi = broker.state.queue_range(TOPIC, queue_id)
        units = broker.state.units(TOPIC, queue_id, lo, hi - lo)
        out[name] = [
            stored_message.decode(broker.state.record_at(u.physical_offset)) for u in units
        ]
    return out


async def test_commit_makes_the_half_visible_once(tmp_path: Path) -> None:
    async with broker_group(tmp_path, **CONFIG) as group:
        leader, follower = group.leader(), group.follower()
        async with (
            open_connection("127.0.0.1", leader.config.listen.port) as to_leader,
            open_connection("127.0.0.1", follower.config.listen.port) as to_follower,
        ):
            half = await send_half(to_follower, "tx-1", b"pay 10", TAGS="paid")
            assert half.transaction_id == "tx-1" and half.queue_id == 1
            assert await pull_all(to_leader, TOPIC, 1) == []  # invisible in its topic
            (stored,) = await pull_all(to_leader, HALF_TOPIC, 0)
            assert stored.queue_offset == half.queue_offset
            assert stored.physical_offset == half.physical_offset
            assert stored.sys_flag & 0xC == 0
            assert stored.properties["REAL_TOPIC"] == TOPIC
            assert stored.properties["REAL_QID"] == "1"
            assert stored.properties["PGROUP"] == PRODUCER_GROUP
            response = await end(to_leader, half, COMMIT)
            assert response.code == ResponseCode.SUCCESS, response.remark
            # again, through another replica, and a rollback after it: nothing changes
            for conn, how in ((to_follower, COMMIT), (to_leader, COMMIT), (to_follower, ROLLBACK)):
                response = await end(conn, half, how)
                assert response.code == ResponseCode.SUCCESS, response.remark
            (message,) = await wait_visible(to_follower, 1, 1)
            await wait_resolved(group, half)
            seen = real_messages(group, 1)
    for messages in seen.values():
        assert [m.properties["UNIQ_KEY"] for m in messages] == ["tx-1"]
    assert message.body == b"pay 10"
    assert message.topic == TOPIC and message.queue_id == 1 and message.queue_offset == 0
    assert message.sys_flag & 0xC == COMMIT
    assert message.prepared_transaction_offset == half.physical_offset
    assert message.properties[HALF_OFFSET] == str(half.queue_offset)
    assert message.properties["TAGS"] == "paid"
    assert message.properties["PGROUP"] == PRODUCER_GROUP
    for gone in ("TRAN_MSG", "REAL_TOPIC", "REAL_QID"):
        assert gone not in message.properties
    assert message.born_timestamp_ms == stored.born_timestamp_ms


async def test_rollback_never_delivers(tmp_path: Path) -> None:
    async with broker_group(tmp_path, **CONFIG) as group:
        leader, follower = group.leader(), group.follower()
        async with (
            open_connection("127.0.0.1", follower.config.listen.port) as conn,
            producer(leader, "p-1", lambda header: COMMIT) as p,
        ):
            half = await send_half(conn, "tx-2")
            response = await end(conn, half, ROLLBACK)
            assert response.code == ResponseCode.SUCCESS, response.remark
            await wait_resolved(group, half)
            # a commit after the rollback, a commit voted by a check: none is taken
            assert (await end(conn, half, COMMIT)).code == ResponseCode.SUCCESS
            with trio.move_on_after(4 * (TIMEOUT_MS + INTERVAL_MS) / 1000):
                await p.wait_checks(1)
            assert p.checks == []  # a resolved half is never checked
            await group.wait_applied_everywhere()
            assert await pull_all(conn, TOPIC, 1) == []
            assert all(not ms for ms in real_messages(group, 1).values())


async def test_unknown_then_a_check_back_that_commits(tmp_path: Path) -> None:
    async with broker_group(tmp_path, **CONFIG) as group:
        leader, follower = group.leader(), group.follower()
        async with (
            open_connection("127.0.0.1", follower.config.listen.port) as conn,
            producer(leader, "p-1", lambda header: COMMIT) as p,
        ):
            sent_at = trio.current_time()
            half = await send_half(conn, "tx-3", b"later")
            response = await end(conn, half, NOT_TYPE)  # the local transaction said UNKNOWN
            assert response.code == ResponseCode.SUCCESS
            await p.wait_checks(1)
            (message,) = await wait_visible(conn, 1, 1)
            await wait_resolved(group, half)
            with trio.move_on_after(3 * INTERVAL_MS / 1000):
                await p.wait_checks(2)
            seen = real_messages(group, 1)
    (checked_at, header, body) = p.checks[0]
    assert len(p.checks) == 1  # the commit it answered ended the checks
    assert checked_at - sent_at >= TIMEOUT_MS / 1000 - 0.05  # not before the timeout
    assert header.tran_state_table_offset == half.queue_offset
    assert header.commit_log_offset == half.physical_offset
    assert header.msg_id == header.transaction_id == "tx-3"
    assert header.offset_msg_id == half.offset_msg_id
    assert (body.topic, body.queue_id, body.body) == (TOPIC, 1, b"later")  # as RocketMQ sends it
    assert body.physical_offset == half.physical_offset
    assert body.properties["UNIQ_KEY"] == "tx-3"
    assert message.body == b"later"
    for messages in seen.values():
        assert [m.properties["UNIQ_KEY"] for m in messages] == ["tx-3"]


async def test_a_half_never_resolved_is_discarded_after_check_max(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker.transaction_check")
    async with broker_group(tmp_path, **CONFIG) as group:
        leader = group.leader()
        async with producer(leader, "p-1", lambda header: NOT_TYPE) as p:
            assert p.conn is not None
            half = await send_half(p.conn, "tx-4")
            await p.wait_checks(CHECK_MAX)
            await wait_resolved(group, half)
            # a commit that comes too late is ignored
            assert (await end(p.conn, half, COMMIT)).code == ResponseCode.SUCCESS
            with trio.move_on_after(3 * INTERVAL_MS / 1000):
                await p.wait_checks(CHECK_MAX + 1)
            await group.wait_applied_everywhere()
            assert await pull_all(p.conn, TOPIC, 1) == []
    assert len(p.checks) == CHECK_MAX
    times = [t for t, _, _ in p.checks]
    assert all(b - a >= INTERVAL_MS / 1000 - 0.05 for a, b in itertools.pairwise(times))
    assert all(h.tran_state_table_offset == half.queue_offset for _, h, _ in p.checks)
    discards = [r.getMessage() for r in caplog.records if "discarded" in r.getMessage()]
    assert discards == [
        f"transaction tx-4 of producer group {PRODUCER_GROUP} to {TOPIC} (half 0) discarded: "
        f"no commit or rollback after {CHECK_MAX} checks"
    ]


async def test_a_dead_producer_is_replaced_by_another_of_its_group(tmp_path: Path) -> None:
    async with broker_group(tmp_path, **CONFIG) as group:
        leader = group.leader()
        async with producer(leader, "p-2", lambda header: COMMIT) as survivor:
            async with producer(leader, "p-1", lambda header: COMMIT) as dying:
                assert dying.conn is not None
                half = await send_half(dying.conn, "tx-5")
            # p-1 died after sending the half, its connection closed: p-2 is asked
            await survivor.wait_checks(1)
            assert survivor.conn is not None
            (message,) = await wait_visible(survivor.conn, 1, 1)
            await wait_resolved(group, half)
    assert dying.checks == []
    assert message.properties["UNIQ_KEY"] == "tx-5"


async def runtime_info(conn: Connection) -> dict[str, str]:
    request = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    response = await conn.request(request, timeout_s=10.0)
    assert response.code == ResponseCode.SUCCESS, response.remark
    table: dict[str, str] = json.loads(response.body)["table"]
    return table


async def test_a_halfs_immunity_time_delays_its_first_check(tmp_path: Path) -> None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS=2 on one half: its first check comes 2 s after it was
    stored, not transactionTimeOut (0.3 s) as the other's; GET_BROKER_RUNTIME_INFO counts the
    pending halves and the oldest one's age meanwhile."""
    async with broker_group(tmp_path, **CONFIG) as group:
        leader, follower = group.leader(), group.follower()
        async with (
            producer(leader, "p-1", lambda header: COMMIT) as p,
            open_connection("127.0.0.1", follower.config.listen.port) as to_follower,
        ):
            assert p.conn is not None
            sent_at = trio.current_time()
            immune = await send_half(p.conn, "tx-immune", CHECK_IMMUNITY_TIME_IN_SECONDS="2")
            plain = await send_half(p.conn, "tx-plain")
            await group.wait_applied_everywhere()
            pending = [await runtime_info(c) for c in (p.conn, to_follower)]
            await p.wait_checks(2)
            for half in (immune, plain):
                await wait_resolved(group, half)
            resolved = [await runtime_info(c) for c in (p.conn, to_follower)]
    first: dict[str | None, float] = {}
    for at, header, _ in p.checks:
        first.setdefault(header.msg_id, at)
    assert list(first) == ["tx-plain", "tx-immune"]
    assert first["tx-immune"] - sent_at >= 2.0 - 0.05
    assert first["tx-plain"] - sent_at < 2.0
    for info in pending:  # the leader's and a follower's: the same applied progress
        assert info["transactionHalfPending"] == "2"
        assert 0 <= int(info["transactionHalfOldestAgeMs"]) < 2000
    for info in resolved:
        assert info["transactionHalfPending"] == "0"
        assert info["transactionHalfOldestAgeMs"] == "0"


async def test_refusals(tmp_path: Path) -> None:
    async with broker_group(tmp_path, **CONFIG) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            half = {"TRAN_MSG": "true", "PGROUP": PRODUCER_GROUP, "UNIQ_KEY": "tx-6"}
            for delay in ({"DELAY": "2"}, {"TIMER_DELAY_SEC": "5"}):
                text = rmq.properties(**half, **delay)
                response = await rmq.send(conn, TOPIC, 0, b"x", props=text)
                assert response.code == ResponseCode.MESSAGE_ILLEGAL
                assert "a transactional message cannot be delayed" in response.remark
            records = [(b"a", 0, props.encode(half)), (b"b", 0, props.encode({"K": "v"}))]
            fields = {
                "a": "pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0",
                "g": "1", "h": "0", "j": "0", "m": "true",
            }  # fmt: skip
            request = RemotingCommand.request(
                RequestCode.SEND_BATCH_MESSAGE, fields, batch.encode(records)
            )
            response = await conn.request(request)
            assert response.code == ResponseCode.MESSAGE_ILLEGAL
            assert "a transactional message cannot be sent in a batch" in response.remark
            response = await rmq.send(conn, HALF_TOPIC, 0, b"x", props=rmq.properties(K="v"))
            assert response.code == ResponseCode.NO_PERMISSION
            assert await pull_all(conn, TOPIC, 0) == []
            # a client cannot pose as a commit: the mark is dropped from an ordinary send
            ordinary = rmq.properties(**{HALF_OFFSET: "0", "UNIQ_KEY": "u-1"})
            response = await rmq.send(conn, TOPIC, 0, b"plain", props=ordinary)
            assert response.code == ResponseCode.SUCCESS, response.remark
            (plain,) = await pull_all(conn, TOPIC, 0)
            assert HALF_OFFSET not in plain.properties
            # END_TRANSACTION that does not name the half right (RocketMQ's remarks)
            tx = await send_half(conn, "tx-7")
            for request, remark in (
                (end_request(tx, COMMIT, group="other"), "The producer group wrong"),
                (
                    end_request(attrs.evolve(tx, queue_offset=tx.queue_offset + 1), COMMIT),
                    "The transaction state table offset wrong",
                ),
                (
                    end_request(
                        attrs.evolve(tx, offset_msg_id=_with_offset(tx, plain.physical_offset)),
                        COMMIT,
                    ),
                    "is not a half message",
                ),
                (end_request(tx, 5), "commitOrRollback 5 is none of"),
            ):
                response = await conn.request(request)
                assert response.code == ResponseCode.SYSTEM_ERROR
                assert remark in response.remark
            await group.wait_applied_everywhere()
            assert not leader.state.metadata.transactions.resolved(tx.queue_offset)
            assert len(await pull_all(conn, TOPIC, 1)) == 0


def _with_offset(half: Half, physical_offset: int) -> str:
    host, _ = parse_offset_msg_id(half.offset_msg_id)
    return offset_msg_id(host, physical_offset)
