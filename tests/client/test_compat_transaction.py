"""client.compat's TransactionMQProducer (the 2.x native binding's shape) against fake brokers
in this trio run (tests/client/fake_cluster.py): each TransactionStatus of `local_execute` on
the wire as END_TRANSACTION, what `local_execute` and `checker_callback` are given and where they
run, and ordinary sends beside. The shared implementation is tested in
test_transaction_producer.py; the brokers' side in tests/broker/test_transactions*.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from client.compat import (
    Message,
    ProducerSendSyncFailed,
    RecvMessage,
    RocketMQException,
    SendStatus,
    TransactionMQProducer,
    TransactionStatus,
)
from tests.client.fake_cluster import fake_cluster
from tests.client.test_transaction_producer import ONE_GROUP, check_request, end_of, wait_for

GROUP = "pg_compat_tx"


def message(n: int) -> Message:
    msg = Message("T")
    msg.set_keys(f"order-{n}")
    msg.set_tags("paid")
    msg.set_property("n", str(n))
    msg.set_body(f"order {n}")
    return msg


async def test_each_status_of_local_execute_ends_the_half_so_and_checks_are_answered() -> None:
    executed: list[tuple[RecvMessage, Any, str]] = []
    checked: list[tuple[RecvMessage, str]] = []
    answers: list[Any] = [
        TransactionStatus.COMMIT,
        TransactionStatus.ROLLBACK,
        TransactionStatus.UNKNOWN,
        1,  # the binding's enum is an IntEnum: its numbers do too (ROLLBACK)
        "commit",  # not a status: UNKNOWN
        RuntimeError("the database is down"),  # UNKNOWN
    ]

    def local_execute(msg: RecvMessage, user_args: Any) -> Any:
        executed.append((msg, user_args, threading.current_thread().name))
        answer = answers[len(executed) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def checker(msg: RecvMessage) -> TransactionStatus:
        checked.append((msg, threading.current_thread().name))
        return TransactionStatus.COMMIT

    async with fake_cluster(ONE_GROUP, topics={"T": 4}) as cluster:
        master = cluster.replica("broker-a", 0)

        async def send_check() -> None:
            await wait_for(master, lambda: master.clients and len(master.ends) == len(answers))
            await master.clients[0].send_oneway(check_request(cluster, "tx-7", group=GROUP))
            await wait_for(master, lambda: len(master.ends) == len(answers) + 1)

        def run() -> tuple[list[Any], Any, str]:
            producer = TransactionMQProducer(GROUP, checker, user_args="unused")
            producer.set_name_server_address(cluster.namesrv_addr)
            producer.start()
            try:
                results = [
                    producer.send_message_in_transaction(message(n), local_execute, {"n": n})
                    for n in range(len(answers))
                ]
                trio.from_thread.run(send_check)
                ordinary = producer.send_sync(message(99))
            finally:
                producer.shutdown()
            return results, ordinary, threading.current_thread().name

        results, ordinary, caller = await trio.to_thread.run_sync(run)
    assert [r.status for r in results] == [SendStatus.OK] * len(answers)
    assert ordinary.status == SendStatus.OK
    flags = [end_of(request).commit_or_rollback for request in master.ends]
    assert flags == [8, 12, 0, 12, 0, 0, 8]  # the last: the check's answer, COMMIT
    for result, request in zip(results, master.ends, strict=False):
        end = end_of(request)
        assert end.transaction_id == result.msg_id and end.from_transaction_check is False
        assert end.producer_group == GROUP
    assert end_of(master.ends[-1]).from_transaction_check is True
    for n, (msg, user_args, thread) in enumerate(executed):
        assert user_args == {"n": n} and thread == caller  # in the calling thread
        assert msg.topic == "T" and msg.body == f"order {n}".encode()
        assert msg.id == results[n].msg_id  # the transaction id
        assert msg.tags == "paid" and msg.keys == f"order-{n}" and msg.get_property("n") == str(n)
        assert msg.get_property("TRAN_MSG") == "true"
    ((seen, thread),) = checked
    assert seen.id == "tx-7" and seen.body == b"checked" and seen.topic == "T"
    assert thread != caller
    stored = cluster.stored()
    assert [s.properties.get("TRAN_MSG") for s in stored] == ["true"] * len(answers) + [None]


async def test_misuse_raises_the_bindings_exceptions() -> None:
    with pytest.raises(RocketMQException, match="callable"):
        TransactionMQProducer(GROUP, None)  # type: ignore[arg-type]
    producer = TransactionMQProducer(GROUP, lambda msg: TransactionStatus.COMMIT)
    with pytest.raises(ProducerSendSyncFailed, match="not started"):
        producer.send_message_in_transaction(message(1), lambda m, a: TransactionStatus.COMMIT)
    async with fake_cluster(ONE_GROUP, topics={"T": 4}) as cluster:

        def run() -> None:
            producer.set_name_server_address(cluster.namesrv_addr)
            with producer:
                delayed = message(2)
                delayed.set_delay_time_level(3)
                with pytest.raises(ProducerSendSyncFailed, match="cannot be delayed"):
                    producer.send_message_in_transaction(
                        delayed, lambda m, a: TransactionStatus.COMMIT
                    )

        await trio.to_thread.run_sync(run)
    assert cluster.sends() == 0
