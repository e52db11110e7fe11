"""What the client raises on purpose. Every message says what happened and what to do about it.

`MQClientError` is the base: the client could not do what was asked (no route, no broker
reachable, a bad argument). `MQBrokerError` carries a broker's refusal with its response code
and remark. `SendOutcomeUnknown` is the one a producer must handle with care: the message may
or may not be stored, and it carries the message's UNIQ_KEY so the application can dedupe.
"""

from __future__ import annotations

import attrs

from remoting.codes import ResponseCode


class MQClientError(Exception):
    """Base of every error the client raises on purpose."""


@attrs.define
class MQBrokerError(MQClientError):
    """A broker answered with a code other than success."""

    code: int
    remark: str
    broker: str = ""  # the address that answered
    # what every attempt of the operation saw, when there were several (a producer's retries)
    causes: list[str] = attrs.field(factory=list)

    def __str__(self) -> str:
        try:
            name = ResponseCode(self.code).name
        except ValueError:
            name = f"code {self.code}"
        at = f" from {self.broker}" if self.broker else ""
        text = f"{name}({self.code}){at}: {self.remark}"
        if self.causes:
            text += " (every attempt: " + "; ".join(self.causes) + ")"
        return text


@attrs.define
class NoRouteError(MQClientError):
    """No namesrv knows the topic, or none could be reached; the text says which."""

    topic: str
    reason: str

    def __str__(self) -> str:
        return f"no route for topic {self.topic!r}: {self.reason}"


@attrs.define
class BrokerUnreachable(MQClientError):
    """Every address tried for a broker group failed; `causes` holds what each attempt saw."""

    what: str  # "send to topic T", "pull T/broker-a/3"
    causes: list[str]

    def __str__(self) -> str:
        return f"{self.what} failed on every attempt: " + "; ".join(self.causes)


@attrs.define
class SendOutcomeUnknown(MQClientError):
    """An attempt of a send got no answer (a timeout, or a connection that closed after the
    request went out) and no attempt stored it: the message may be stored. Dedupe by
    `uniq_key` (the message's UNIQ_KEY, which a consumer sees as `MessageExt.msg_id`); to send
    it again under the same id, put it in the message's properties as "UNIQ_KEY"."""

    topic: str
    uniq_key: str
    cause: str

    def __str__(self) -> str:
        return (
            f"send to {self.topic!r} has an unknown outcome ({self.cause}): the message may have "
            f"been stored; its UNIQ_KEY is {self.uniq_key}, dedupe by it if you send it again"
        )


@attrs.define
class InvalidMessage(MQClientError):
    """A message (or a producer setting) the client refuses before anything is sent, as a
    RocketMQ client's Validators do: `field` names what is wrong ("topic", "body", ...)."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"invalid {self.field}: {self.reason}"


class ClientClosed(MQClientError):
    """The producer or consumer was used after close() or outside its `with` block."""
