"""Transactional messages: `AsyncTransactionProducer` for trio code, `TransactionProducer`
(client/blocking_transaction_producer.py) for everything else, on AsyncProducer's sending.

    class Listener:
        def execute_local_transaction(self, msg, arg):   # after the half message is stored
            db.insert(order=arg, tx=msg.properties["UNIQ_KEY"])
            return LocalTransactionState.COMMIT
        def check_local_transaction(self, msg):          # the broker asks, later
            return LocalTransactionState.COMMIT if db.has(tx=msg.msg_id) else ...ROLLBACK

    async with AsyncTransactionProducer("pg", "127.0.0.1:9876", Listener()) as producer:
        result = await producer.send_message_in_transaction(Message("Orders", b"..."), arg=order)

`send_message_in_transaction` (RocketMQ's sendMessageInTransaction) sends the message as a half
message (TRAN_MSG=true, PGROUP=<group>, the prepared sys flag), which the broker keeps out of
sight of consumers; then runs the listener's `execute_local_transaction(msg, arg)`, and sends
END_TRANSACTION one-way to the group that stored the half: commit makes the message visible,
rollback discards it, UNKNOWN (or an exception, or an END_TRANSACTION that is lost) leaves it to
the broker, which asks a live producer of the group later (CHECK_TRANSACTION_STATE): this
producer answers with `check_local_transaction(msg)` (a MessageExt whose `msg_id` is the
transaction id). The listener's methods may be `async def` (awaited on the producer's loop) or
plain functions (run in a worker thread, CHECK_THREADS at once).

The transaction id is the message's UNIQ_KEY: `msg.properties["UNIQ_KEY"]` in
execute_local_transaction, `msg.msg_id` in check_local_transaction, `transaction_id` in the
result. A transactional message cannot be delayed or sent in a batch (InvalidMessage here;
the broker refuses them too).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

from client import limits
from client.consume_service import is_async
from client.errors import InvalidMessage, NoRouteError
from client.instance import TRANSPORT_FAILURES
from client.message import Message, MessageExt
from client.producer import DEFAULT_NAMESRV, AsyncProducer
from client.send_request import prepare, uniq_key_of
from client.send_result import SendResult, SendStatus
from client.validation import check_message
from remoting import properties as props
from remoting import stored_message
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.errors import MessageFormatError, RemotingError
from remoting.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from remoting.message_id import parse_offset_msg_id

log = logging.getLogger("client.transaction_producer")

PREPARED_FLAG = 0x4  # MessageSysFlag.TRANSACTION_PREPARED_TYPE
COMMIT_FLAG = 0x8
ROLLBACK_FLAG = 0xC
NOT_TYPE_FLAG = 0x0  # the producer does not know (yet): the broker asks again later
CHECK_THREADS = 4  # plain-function checks running at once (Java's checkThreadPool)
END_TIMEOUT_S = 3.0  # handing END_TRANSACTION to a connection
# properties that delay a message; a transactional message may have none of them
DELAY_PROPERTIES = frozenset(
    {props.DELAY, "TIMER_DELIVER_MS", "__STARTDELIVERTIME", "TIMER_DELAY_SEC", "TIMER_DELAY_MS"}
)


class LocalTransactionState(enum.Enum):
    """What a local transaction came to (RocketMQ's COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW)."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"

    @property
    def flag(self) -> int:
        """END_TRANSACTION's commitOrRollback."""
        return {"COMMIT": COMMIT_FLAG, "ROLLBACK": ROLLBACK_FLAG}.get(self.name, NOT_TYPE_FLAG)


State = LocalTransactionState | Awaitable[LocalTransactionState]


class TransactionListener(Protocol):
    """What a transaction producer calls: both methods plain, or both `async def`."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> State: ...

    def check_local_transaction(self, msg: MessageExt) -> State: ...


@attrs.frozen
class TransactionSendResult(SendResult):
    """A SendResult of the half message, with what the local transaction came to and the
    transaction id (the message's UNIQ_KEY, also `msg_id`)."""

    local_state: LocalTransactionState
    transaction_id: str


def local_state(outcome: object, what: str) -> LocalTransactionState:
    """A listener's answer as a state: anything but a LocalTransactionState is UNKNOWN."""
    if isinstance(outcome, LocalTransactionState):
        return outcome
    log.warning("%s answered %r, not a LocalTransactionState: counted as UNKNOWN", what, outcome)
    return LocalTransactionState.UNKNOWN


def check_transactional(message: Message) -> None:
    """Raise InvalidMessage unless `message` may be sent in a transaction."""
    check_message(message)
    delayed = sorted(DELAY_PROPERTIES & message.properties.keys())
    if message.delay_level or delayed:
        what = f"properties {', '.join(delayed)}" if delayed else "a delay level"
        raise InvalidMessage("delay_level", f"a transactional message cannot be delayed ({what})")


class AsyncTransactionProducer(AsyncProducer):
    """A transaction producer for trio code: `async with AsyncTransactionProducer(group,
    namesrv, listener) as p:`. Other arguments as AsyncProducer's, whose send methods it also
    has (for ordinary messages)."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = DEFAULT_NAMESRV,
        listener: TransactionListener | None = None,
        *,
        retry_times: int = limits.RETRY_TIMES_DEFAULT,
        send_timeout: float = limits.SEND_TIMEOUT_S_DEFAULT,
        instance_name: str | None = None,
    ) -> None:
        if listener is None:
            raise InvalidMessage("listener", "a transaction producer needs a TransactionListener")
        for name in ("execute_local_transaction", "check_local_transaction"):
            if not callable(getattr(listener, name, None)):
                raise InvalidMessage("listener", f"{type(listener).__name__} has no {name}()")
        super().__init__(
            group,
            namesrv,
            retry_times=retry_times,
            send_timeout=send_timeout,
            instance_name=instance_name,
        )
        self.listener = listener
        self._check_threads = trio.CapacityLimiter(CHECK_THREADS)

    async def __aenter__(self) -> AsyncTransactionProducer:
        await super().__aenter__()
        instance = self._live()
        instance.serve(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)
        # As Java's producer, know every broker from the start (TBW102's route), so that the
        # heartbeats reach them and their checks reach us before we send anything.
        try:
            await instance.refresh(limits.DEFAULT_TOPIC)
        except NoRouteError as err:  # no namesrv answered: the first send's route does it
            log.info("brokers hear from this producer after its first send: %s", err)
        instance.heartbeat_now()
        return self

    # --- sending -------------------------------------------------------------------------------

    async def send_message_in_transaction(
        self, message: Message, arg: Any = None, timeout: float | None = None
    ) -> TransactionSendResult:
        """Send `message` as a half message, run the local transaction, end it (module
        docstring). Raises what AsyncProducer.send raises when the half is not stored (the
        local transaction does not run then)."""
        half, result = await self.send_half(message, timeout)
        if result.status is SendStatus.SEND_OK:
            state = await self._call(self.listener.execute_local_transaction, half, arg)
        else:  # stored but not durable enough: RocketMQ rolls it back
            state = LocalTransactionState.ROLLBACK
        return await self.end_transaction(result, state)

    async def send_half(
        self, message: Message, timeout: float | None = None
    ) -> tuple[Message, SendResult]:
        """Store `message` as a half message: the message as the listener sees it (with its
        UNIQ_KEY, TRAN_MSG and PGROUP) and the send's result."""
        instance = self._accepting()
        check_transactional(message)
        uniq_key = uniq_key_of(message, instance.uniq_ids)
        extra = {props.UNIQ_KEY: uniq_key, props.TRAN_MSG: "true", props.PGROUP: self.group}
        half = attrs.evolve(message, properties={**message.properties, **extra})
        outgoing = prepare(half, instance.uniq_ids)
        outgoing = attrs.evolve(outgoing, sys_flag=outgoing.sys_flag | PREPARED_FLAG)
        deadline = trio.current_time() + self._timeout(timeout)
        return half, await self._send(outgoing, half, None, None, deadline)

    async def end_transaction(
        self, result: SendResult, state: LocalTransactionState
    ) -> TransactionSendResult:
        """END_TRANSACTION one-way for the half `result` names, to its group (the master
        first, then any replica: each forwards it to its leader). When it reaches none, the
        broker's check settles the transaction later; that is logged, not raised."""
        instance = self._live()
        _, physical_offset = parse_offset_msg_id(result.offset_msg_id)
        header = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=result.queue_offset,
            commit_log_offset=physical_offset,
            commit_or_rollback=state.flag,
            from_transaction_check=False,
            msg_id=result.msg_id,
            transaction_id=result.msg_id,
        )
        causes = []
        for address in instance.broker_addresses(result.queue.broker_name):
            request = RemotingCommand.request(
                RequestCode.END_TRANSACTION, header.encode(), oneway=True
            )
            try:
                with trio.fail_after(END_TIMEOUT_S):
                    conn = await instance.pool.get(address)
                    await conn.send_oneway(request)
                break
            except (*TRANSPORT_FAILURES, ValueError) as err:
                causes.append(f"{address}: {err or type(err).__name__}")
        else:
            log.warning(
                "END_TRANSACTION (%s) of %s reached no replica of %s (%s); the broker will ask",
                state.name,
                result.msg_id,
                result.queue.broker_name,
                "; ".join(causes) or "no address known",
            )
        return TransactionSendResult(
            result.status,
            result.msg_id,
            result.offset_msg_id,
            result.queue,
            result.queue_offset,
            state,
            result.msg_id,
        )

    # --- the broker's checks ----------------------------------------------------------------

    async def _call(self, fn: Callable[..., Any], *args: Any) -> LocalTransactionState:
        """A listener method's answer: awaited when async, else in a worker thread; an
        exception is logged and counts as UNKNOWN (RocketMQ's)."""
        what = getattr(fn, "__name__", "the listener")
        try:
            if is_async(fn):
                outcome = await fn(*args)
            else:
                outcome = await trio.to_thread.run_sync(
                    fn, *args, limiter=self._check_threads, abandon_on_cancel=True
                )
        except Exception:
            log.exception("%s raised: counted as UNKNOWN", what)
            return LocalTransactionState.UNKNOWN
        return local_state(outcome, what)

    async def _on_check(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """CHECK_TRANSACTION_STATE (39): ask the listener, answer END_TRANSACTION one-way to
        the broker that asked (Java's checkTransactionState)."""
        try:
            header = CheckTransactionStateRequestHeader.decode(request.ext_fields)
            record = stored_message.decode(request.body)
        except (RemotingError, MessageFormatError) as err:
            log.warning("unreadable CHECK_TRANSACTION_STATE from %s: %s", conn.peer, err)
            return request.response(ResponseCode.SYSTEM_ERROR, str(err))
        group = record.properties.get(props.PGROUP)
        if group is not None and group != self.group:
            log.warning("a check for producer group %s reached %s; ignored", group, self.group)
            return request.response(ResponseCode.SUCCESS)
        instance = self._live()
        message = MessageExt.from_stored(record, instance.broker_name_of(conn.peer) or "")
        state = await self._call(self.listener.check_local_transaction, message)
        end = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=message.commit_log_offset,
            commit_or_rollback=state.flag,
            from_transaction_check=True,
            msg_id=message.msg_id,
            transaction_id=header.transaction_id,
        )
        answer = RemotingCommand.request(RequestCode.END_TRANSACTION, end.encode(), oneway=True)
        try:
            await conn.send_oneway(answer)
        except RemotingError as err:
            log.warning("END_TRANSACTION for the check of %s not sent: %s", message.msg_id, err)
        log.debug("checked %s: %s", message.msg_id, state.name)
        return request.response(ResponseCode.SUCCESS)
