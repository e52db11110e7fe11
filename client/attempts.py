"""One attempt of a send: one broker group, through its replicas, and what each one said.

An attempt tries the group's addresses in turn, the master first (ClientInstance.
broker_addresses): every replica of our broker forwards a write to its Raft leader, so any of
them stores the message while the route still names a dead master, and a RocketMQ slave that
refuses (SERVICE_NOT_AVAILABLE) leaves the master to try. Each address's request ends one of
three ways, and the difference is what the application is told in the end:

- stored: an answer with SUCCESS or one of the "stored, not durable enough" codes;
- refused (surely not stored): the connection could not be made, or the broker answered with
  another code;
- unknown (maybe stored): the request went out and no answer came (a timeout, or the
  connection closed after it was written), or our broker answered that the write's commit
  is unknown.

No request waits for its answer longer than the send's RequestBudget (limits.REQUEST_S_FIRST to
begin with, doubled each time a request runs out of it, and at least three times the group's
slowest recent answer): a master that is paused, cut off or deposed without knowing it yet
costs that much, and the next replica takes the write. An
address that failed is tried after the others for a while (FaultTracker.replica_order).

`send_error` turns the failures of every attempt of a send into the exception it raises:
SendOutcomeUnknown if any attempt may have stored the message, else MQBrokerError when a
broker refused it, else BrokerUnreachable.
"""

from __future__ import annotations

import attrs
import trio

from client import limits
from client.connections import CONNECT_TIMEOUT_S
from client.errors import BrokerUnreachable, MQBrokerError, MQClientError, SendOutcomeUnknown
from client.fault import FaultTracker
from client.instance import ClientInstance
from client.message import MessageQueue
from client.send_request import (
    RETRYABLE_CODES,
    Outgoing,
    forwarded,
    outcome_unknown,
    request,
    stored_result,
)
from client.send_result import SendResult
from remoting.codes import ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import ConnectionClosed, RequestTimeout

REQUEST_S_MIN = 0.01  # a request is not begun with less of the send timeout left than this


@attrs.frozen
class ReplicaFailure:
    """What one address of a group did with one request."""

    address: str
    reason: str  # "cannot connect: ...", "SERVICE_NOT_AVAILABLE(14): ...", "no answer in 3 s"
    unknown: bool = False  # the request went out and may have been stored
    code: int | None = None  # the broker's answer, when it refused
    remark: str = ""
    timed_out: bool = False  # no answer within the time the request was given

    def __str__(self) -> str:
        return f"{self.address} {self.reason}"


@attrs.define
class RequestBudget:
    """How long the next request of one send may wait for its answer: limits.REQUEST_S_FIRST
    plus REQUEST_S_PER_MIB per MiB of body, doubled after each request that ran out of it."""

    wait_s: float

    @classmethod
    def for_send(cls, outgoing: Outgoing) -> RequestBudget:
        mib = outgoing.body_bytes / limits.MiB
        return cls(limits.REQUEST_S_FIRST + mib * limits.REQUEST_S_PER_MIB)

    def ran_out(self) -> None:
        self.wait_s *= 2

    def wait_for_s(self, slow_answer_s: float) -> float:
        """The wait of a request to a group whose slowest recent answer took `slow_answer_s`."""
        return max(self.wait_s, limits.REQUEST_LATENCY_FACTOR * slow_answer_s)


@attrs.frozen
class Stored:
    """What the attempt that stored a message found."""

    result: SendResult
    latency_s: float  # of the request that stored it
    address: str  # the replica that answered
    forwarded: bool  # that replica forwarded the write to its leader: the route is stale
    passed_over: tuple[ReplicaFailure, ...]  # the attempt's requests that failed before it


@attrs.define
class GroupFailure(Exception):
    """Every address of a group tried by one attempt failed (or the time ran out)."""

    broker_name: str
    replicas: tuple[ReplicaFailure, ...]
    final: bool = False  # a refusal another try cannot change (MESSAGE_ILLEGAL, ...)
    note: str = ""  # why fewer addresses than the group has were tried

    @property
    def unknown(self) -> bool:
        return any(r.unknown for r in self.replicas)

    def __str__(self) -> str:
        parts = [str(r) for r in self.replicas]
        if self.note:
            parts.append(self.note)
        if self.final:
            return f"{self.broker_name}: refused: " + "; ".join(parts)
        return f"{self.broker_name}: every replica refused or was unreachable: " + "; ".join(parts)


def _refusal(address: str, response: RemotingCommand) -> ReplicaFailure:
    try:
        name = ResponseCode(response.code).name
    except ValueError:
        name = "code"
    return ReplicaFailure(
        address,
        f"answered {name}({response.code}): {response.remark}",
        code=response.code,
        remark=response.remark,
    )


async def request_once(
    instance: ClientInstance,
    address: str,
    command: RemotingCommand,
    timeout_s: float,
    *,
    drop_on_timeout: bool = True,
) -> RemotingCommand | ReplicaFailure:
    """The answer of `address`, or why there is none (refused before sending, or unknown).
    Without an answer in time the connection is dropped (it may be half dead) unless
    `drop_on_timeout` is false: a request cut short by its budget leaves the connection to the
    other requests on it, which may be answered yet."""
    started = trio.current_time()
    try:
        conn = await instance.pool.get_within(address, min(CONNECT_TIMEOUT_S, timeout_s))
    except (OSError, trio.TooSlowError, ValueError) as err:
        reason = str(err) or type(err).__name__
        return ReplicaFailure(address, f"cannot connect: {reason}")
    if conn.closed:
        return ReplicaFailure(address, "the connection closed before the request was sent")
    left_s = timeout_s - (trio.current_time() - started)
    if left_s <= 0:
        return ReplicaFailure(address, "connected, but the send timeout ran out before sending")
    try:
        return await conn.request(command, left_s)
    except RequestTimeout:
        if drop_on_timeout:
            instance.pool.drop(address)  # it may be half dead; the next request connects again
        return ReplicaFailure(
            address, f"sent, but no answer within {left_s:.3g} s", unknown=True, timed_out=True
        )
    except ConnectionClosed as err:
        return ReplicaFailure(
            address,
            f"sent, but the connection closed before the answer ({err.reason})",
            unknown=True,
        )


async def attempt(
    instance: ClientInstance,
    group: str,
    outgoing: Outgoing,
    queue: MessageQueue,
    deadline: float,
    budget: RequestBudget | None = None,
    tracker: FaultTracker | None = None,
) -> Stored:
    """Send `outgoing` to `queue` through the first replica of its group that stores it, each
    request waiting at most `budget` (unbounded within the deadline without one); `tracker`
    orders the replicas and hears how each did. Raises GroupFailure."""
    addresses = instance.broker_addresses(queue.broker_name)
    if not addresses:
        raise GroupFailure(queue.broker_name, (), note="the route names no address for it")
    if tracker is not None:
        addresses = tracker.replica_order(addresses)
    failures: list[ReplicaFailure] = []
    for address in addresses:
        left_s = deadline - trio.current_time()
        if left_s < REQUEST_S_MIN:
            raise GroupFailure(
                queue.broker_name,
                tuple(failures),
                note=f"the send timeout ran out before {address} was tried",
            )
        wait_s = left_s
        if budget is not None:
            slow_s = 0.0 if tracker is None else tracker.slow_answer_s(queue.broker_name)
            wait_s = min(left_s, budget.wait_for_s(slow_s))
        started = trio.current_time()
        answer = await request_once(
            instance,
            address,
            request(group, outgoing, queue.queue_id),
            wait_s,
            drop_on_timeout=wait_s >= left_s,
        )
        result = (
            None if isinstance(answer, ReplicaFailure) else stored_result(answer, queue, outgoing)
        )
        if result is not None:
            assert isinstance(answer, RemotingCommand)
            if tracker is not None:
                tracker.address_answered(address)
            latency_s = trio.current_time() - started
            return Stored(result, latency_s, address, forwarded(answer), tuple(failures))
        failure = _failure(address, answer)
        failures.append(failure)
        if tracker is not None and (failure.code is None or failure.code in RETRYABLE_CODES):
            # (not for a refusal of the message itself)
            tracker.address_failed(address, answered=not isinstance(answer, ReplicaFailure))
        if failure.timed_out and budget is not None and wait_s < left_s:
            budget.ran_out()  # (a request given more for its group's slowness counts the same)
        if failure.code is not None and failure.code not in RETRYABLE_CODES:
            raise GroupFailure(queue.broker_name, tuple(failures), final=True)
    raise GroupFailure(queue.broker_name, tuple(failures))


def _failure(address: str, answer: RemotingCommand | ReplicaFailure) -> ReplicaFailure:
    """What went wrong, for an answer that is not "stored"."""
    if isinstance(answer, ReplicaFailure):
        return answer
    if outcome_unknown(answer):
        return attrs.evolve(_refusal(address, answer), unknown=True, code=None)
    return _refusal(address, answer)


def send_error(what: str, outgoing: Outgoing, failures: list[GroupFailure]) -> MQClientError:
    """The exception a send whose every attempt failed raises: `failures` in attempt order."""
    causes = [str(f) for f in failures]
    if any(f.unknown for f in failures):
        return SendOutcomeUnknown(outgoing.topic, outgoing.uniq_key, "; ".join(causes))
    refusals = [r for f in failures for r in f.replicas if r.code is not None]
    if refusals:
        last = refusals[-1]
        assert last.code is not None
        return MQBrokerError(last.code, last.remark, last.address, causes)
    if not causes:
        causes = ["the send timeout ran out before any broker was tried"]
    return BrokerUnreachable(what, causes)
