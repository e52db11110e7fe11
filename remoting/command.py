"""One command on the remoting wire: a request or its response, matched by opaque.

RocketMQ uses one type for both (RemotingCommand.java); so do we. Header fields of a given
request are read and written through the classes in remoting/headers.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, OUR_VERSION, ResponseCode, SerializeType


@attrs.frozen
class RemotingCommand:
    code: int  # a RequestCode in a request, a ResponseCode in a response
    opaque: int = 0  # chosen by the requester; the response carries the same
    flag: int = 0  # FLAG_RESPONSE, FLAG_ONEWAY
    remark: str = ""  # a sentence in error responses; "" in requests
    ext_fields: Mapping[str, str] = attrs.field(factory=dict)  # header fields, values as text
    body: bytes = b""
    language: str = "PYTHON"  # LanguageCode name; any text in a JSON header
    version: int = OUR_VERSION
    serialization: SerializeType = SerializeType.JSON  # of the header; answers use the request's

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """The one-way bit. Clients of C++ 1.2.x never set it on what they treat as one-way."""
        return bool(self.flag & FLAG_ONEWAY)

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
        serialization: SerializeType = SerializeType.JSON,
    ) -> RemotingCommand:
        """A request; its opaque is set by the connection that sends it."""
        return cls(
            code=int(code),
            flag=FLAG_ONEWAY if oneway else 0,
            ext_fields=dict(ext_fields or {}),
            body=body,
            serialization=serialization,
        )

    def with_opaque(self, opaque: int, flag: int | None = None) -> RemotingCommand:
        """This command under another opaque (and flag): what a connection sends. Built
        directly, as `attrs.evolve` costs several times more on every request and answer."""
        return RemotingCommand(
            self.code,
            opaque,
            self.flag if flag is None else flag,
            self.remark,
            self.ext_fields,
            self.body,
            self.language,
            self.version,
            self.serialization,
        )

    def answering(self, request: RemotingCommand) -> RemotingCommand:
        """This response as the answer to `request`: its opaque and serialization, the
        response bit (whatever a handler built, the connection matches it so)."""
        return RemotingCommand(
            self.code,
            request.opaque,
            FLAG_RESPONSE,
            self.remark,
            self.ext_fields,
            self.body,
            self.language,
            self.version,
            request.serialization,
        )

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str = "",
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The answer to this request: same opaque, same serialization, the response bit."""
        assert not self.is_response, "a response is not answered"
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=dict(ext_fields or {}),
            body=body,
            serialization=self.serialization,
        )
