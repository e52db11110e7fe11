"""RemotingCommand's shortcuts the connection uses on every request and answer."""

from __future__ import annotations

import pytest

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
    assert COMMAND.with_opaque(99) == COMMAND._replace(opaque=99)
    assert COMMAND.with_opaque(99, 3) == COMMAND._replace(opaque=99, flag=3)


def test_answering_takes_the_request_s_opaque_and_serialization() -> None:
    request = RemotingCommand(code=11, opaque=42, serialization=SerializeType.ROCKETMQ)
    answer = COMMAND.answering(request)
    assert answer == COMMAND._replace(
        opaque=42, flag=FLAG_RESPONSE, serialization=SerializeType.ROCKETMQ
    )
    assert answer.is_response


def test_a_response_is_a_command_of_its_own_with_its_own_fields() -> None:
    request = RemotingCommand(code=11, opaque=42, serialization=SerializeType.ROCKETMQ)
    fields = {"k": "v"}
    response = request.response(1, "no", fields, b"b")
    assert response == RemotingCommand(
        code=1,
        opaque=42,
        flag=FLAG_RESPONSE,
        remark="no",
        ext_fields={"k": "v"},
        body=b"b",
        serialization=SerializeType.ROCKETMQ,
    )
    fields["k"] = "changed"  # the response took a copy
    assert response.ext_fields == {"k": "v"}
    assert request.response().ext_fields == {}


def test_a_command_built_without_fields_cannot_have_them_added() -> None:
    command = RemotingCommand(code=10)
    assert command.ext_fields == {}
    with pytest.raises(TypeError):
        command.ext_fields["x"] = "1"  # type: ignore[index]
