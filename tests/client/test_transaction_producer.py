"""The transaction producers against fake brokers in this trio run (tests/client/fake_cluster.py):
the half message and END_TRANSACTION on the wire, each local state and a failing listener, the
end going to another replica when the master is down, a broker's CHECK_TRANSACTION_STATE
answered (in a worker thread for the blocking API), and what is refused before anything is sent.
The brokers' side is tests/broker/test_transactions*.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from client import (
    AsyncTransactionProducer,
    InvalidMessage,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionProducer,
)
from remoting import properties as props
from remoting import stored_message
from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from remoting.message_id import offset_msg_id, parse_offset_msg_id
from tests.client.fake_cluster import FakeCluster, Replica, fake_cluster

GROUP = "pg_tx"
ONE_GROUP = {"broker-a": 2}
WAIT_S = 10.0


class Listener:
    """Answers `state` (or raises it when it is an exception); records what it was given."""

    def __init__(self, state: object) -> None:
        self.state = state
        self.executed: list[tuple[Message, Any]] = []
        self.checked: list[tuple[MessageExt, str]] = []

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        self.executed.append((msg, arg))
        return self._answer()

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        self.checked.append((msg, threading.current_thread().name))
        return self._answer()

    def _answer(self) -> Any:
        if isinstance(self.state, Exception):
            raise self.state
        return self.state


async def wait_for(replica: Replica, ready: Any) -> None:
    with trio.fail_after(WAIT_S):
        while not ready():
            await replica.arrived.wait()


def end_of(request: RemotingCommand) -> EndTransactionRequestHeader:
    assert request.code == RequestCode.END_TRANSACTION and request.is_oneway
    return EndTransactionRequestHeader.decode(request.ext_fields)


@pytest.mark.parametrize(
    ("state", "flag"),
    [
        (LocalTransactionState.COMMIT, 8),
        (LocalTransactionState.ROLLBACK, 12),
        (LocalTransactionState.UNKNOWN, 0),
        (RuntimeError("the database is down"), 0),  # counted as UNKNOWN
        ("commit", 0),  # not a state: UNKNOWN
    ],
)
async def test_a_half_message_then_its_end(state: object, flag: int) -> None:
    listener = Listener(state)
    async with (
        fake_cluster(ONE_GROUP, topics={"T": 4}) as cluster,
        AsyncTransactionProducer(GROUP, cluster.namesrv_addr, listener) as producer,
    ):
        message = Message("T", b"order 1", tags="A", properties={"k": "v"})
        result = await producer.send_message_in_transaction(message, arg={"order": 1})
        master = cluster.replica("broker-a", 0)
        await wait_for(master, lambda: master.ends)
    (stored,) = cluster.stored()
    assert stored.header.sys_flag & 0xC == 0x4  # prepared
    assert stored.properties[props.TRAN_MSG] == "true"
    assert stored.properties[props.PGROUP] == GROUP
    assert stored.properties["k"] == "v" and stored.properties[props.TAGS] == "A"
    ((seen, arg),) = listener.executed
    assert arg == {"order": 1} and seen.body == b"order 1"
    assert seen.properties[props.UNIQ_KEY] == result.transaction_id == result.msg_id
    assert seen.properties[props.TRAN_MSG] == "true"
    assert message.properties == {"k": "v"}  # the application's message is left as it was
    expected = LocalTransactionState.UNKNOWN if flag == 0 else state
    assert result.local_state is expected
    (request,) = master.ends
    end = end_of(request)
    assert end.commit_or_rollback == flag
    assert end.producer_group == GROUP
    assert end.tran_state_table_offset == result.queue_offset
    assert end.commit_log_offset == parse_offset_msg_id(result.offset_msg_id)[1]
    assert end.msg_id == end.transaction_id == result.transaction_id
    assert end.from_transaction_check is False


async def test_the_end_goes_to_another_replica_when_the_master_is_down() -> None:
    listener = Listener(LocalTransactionState.COMMIT)
    async with (
        fake_cluster(ONE_GROUP, topics={"T": 4}, down=("broker-a/0",)) as cluster,
        AsyncTransactionProducer(GROUP, cluster.namesrv_addr, listener) as producer,
    ):
        result = await producer.send_message_in_transaction(Message("T", b"x"))
        other = cluster.replica("broker-a", 1)
        await wait_for(other, lambda: other.ends)
    assert end_of(other.ends[0]).transaction_id == result.transaction_id


def check_request(cluster: FakeCluster, uniq_key: str, group: str = GROUP) -> RemotingCommand:
    """CHECK_TRANSACTION_STATE as our broker sends it: the half as a record of its real topic."""
    properties = {props.UNIQ_KEY: uniq_key, props.PGROUP: group, props.TRAN_MSG: "true"}
    host = ("127.0.0.1", cluster.replica("broker-a", 0).port)
    body = stored_message.pack(
        queue_id=2,
        flag=0,
        queue_offset=7,
        physical_offset=4096,
        sys_flag=0,
        born_timestamp_ms=1,
        born_host=("127.0.0.1", 1),
        store_timestamp_ms=2,
        store_host=host,
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"checked",
        topic="T",
        properties_data=props.encode(properties),
    )
    header = CheckTransactionStateRequestHeader(
        tran_state_table_offset=7,
        commit_log_offset=4096,
        msg_id=uniq_key,
        transaction_id=uniq_key,
        offset_msg_id=offset_msg_id(host, 4096),
    )
    return RemotingCommand.request(
        RequestCode.CHECK_TRANSACTION_STATE, header.encode(), body, oneway=True
    )


async def test_a_check_is_answered_with_the_listeners_state() -> None:
    listener = Listener(LocalTransactionState.ROLLBACK)
    async with (
        fake_cluster(ONE_GROUP, topics={"T": 4}) as cluster,
        AsyncTransactionProducer(GROUP, cluster.namesrv_addr, listener),
    ):
        master = cluster.replica("broker-a", 0)
        await wait_for(master, lambda: master.clients)  # heartbeats without any send
        await master.clients[0].send_oneway(check_request(cluster, "tx-9"))
        await master.clients[0].send_oneway(check_request(cluster, "tx-10", group="other"))
        await wait_for(master, lambda: master.ends)
        with trio.move_on_after(0.5):  # the other group's check is not answered
            await wait_for(master, lambda: len(master.ends) > 1)
    ((message, _),) = listener.checked
    assert message.msg_id == "tx-9" and message.topic == "T" and message.body == b"checked"
    assert message.queue.broker_name == "broker-a" and message.queue.queue_id == 2
    (request,) = master.ends
    end = end_of(request)
    assert end.from_transaction_check is True
    assert end.commit_or_rollback == 12
    assert (end.tran_state_table_offset, end.commit_log_offset) == (7, 4096)
    assert end.msg_id == end.transaction_id == "tx-9"
    assert end.producer_group == GROUP


async def test_the_blocking_api_runs_each_listener_where_it_should() -> None:
    """execute_local_transaction in the caller's thread, checks in a worker thread."""
    listener = Listener(LocalTransactionState.COMMIT)
    async with fake_cluster(ONE_GROUP, topics={"T": 4}) as cluster:

        def run() -> tuple[str, str]:
            with TransactionProducer(GROUP, cluster.namesrv_addr, listener) as producer:
                caller = threading.current_thread().name
                result = producer.send_message_in_transaction(Message("T", b"b"), arg=1)
                assert result.local_state is LocalTransactionState.COMMIT
                trio.from_thread.run(send_check)
                return caller, threading.current_thread().name

        async def send_check() -> None:
            master = cluster.replica("broker-a", 0)
            await wait_for(master, lambda: master.clients and master.ends)
            await master.clients[0].send_oneway(check_request(cluster, "tx-11"))
            await wait_for(master, lambda: len(master.ends) == 2)

        caller, _ = await trio.to_thread.run_sync(run)
        threads = {name for _, name in listener.checked}
    assert len(listener.executed) == 1
    (checker,) = threads
    assert checker not in (caller, threading.current_thread().name)
    assert not checker.startswith("mq-tx-producer")  # not the client's own loop


async def test_refused_before_anything_is_sent() -> None:
    with pytest.raises(InvalidMessage, match="needs a TransactionListener"):
        AsyncTransactionProducer(GROUP, "127.0.0.1:9876")
    with pytest.raises(InvalidMessage, match="has no execute_local_transaction"):
        AsyncTransactionProducer(GROUP, "127.0.0.1:9876", object())  # type: ignore[arg-type]
    listener = Listener(LocalTransactionState.COMMIT)
    async with (
        fake_cluster(ONE_GROUP, topics={"T": 4}) as cluster,
        AsyncTransactionProducer(GROUP, cluster.namesrv_addr, listener) as producer,
    ):
        for message in (
            Message("T", b"x", delay_level=3),
            Message("T", b"x", properties={"DELAY": "2"}),
            Message("T", b"x", properties={"TIMER_DELAY_SEC": "10"}),
        ):
            with pytest.raises(InvalidMessage, match="cannot be delayed"):
                await producer.send_message_in_transaction(message)
        with pytest.raises(InvalidMessage, match="body"):
            await producer.send_message_in_transaction(Message("T", b""))
    assert cluster.sends() == 0 and listener.executed == []
