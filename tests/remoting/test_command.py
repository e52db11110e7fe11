"""RemotingCommand's shortcuts the connection uses on every request and answer."""

from __future__ import annotations

import attrs

from remoting.codes import FLAG_RESPONSE, SerializeType
from remoting.command import RemotingCommand

COMMAND = RemotingCommand(
    code=310,
    opaque=7,
    flag=2,
    remark="why",
    ext_fields={"a": "1"},
    body=b"body",
    language="CPP",
    version=401,
    serialization=SerializeType.JSON,
)


def test_with_opaque_changes_only_the_opaque_and_the_flag() -> None:
    assert COMMAND.with_opaque(99) == attrs.evolve(COMMAND, opaque=99)
    assert COMMAND.with_opaque(99, 3) == attrs.evolve(COMMAND, opaque=99, flag=3)


def test_answering_takes_the_request_s_opaque_and_serialization() -> None:
    request = RemotingCommand(code=11, opaque=42, serialization=SerializeType.ROCKETMQ)
    answer = COMMAND.answering(request)
    assert answer == attrs.evolve(
        COMMAND, opaque=42, flag=FLAG_RESPONSE, serialization=SerializeType.ROCKETMQ
    )
    assert answer.is_response
