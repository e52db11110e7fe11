"""A table from request code to handler, as RocketMQ's registerProcessor builds one.

Unknown codes are answered REQUEST_CODE_NOT_SUPPORTED with a remark naming the code; a request
whose header fields are missing or unreadable is answered SYSTEM_ERROR naming the field (as a
Java broker answers a RemotingCommandException); any other exception is a bug in the handler,
answered SYSTEM_ERROR and logged with its traceback. The connection goes on in every case.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from remoting.codes import ResponseCode, code_name
from remoting.command import RemotingCommand
from remoting.connection import BatchHandler, Connection, RequestHandler
from remoting.errors import HeaderFieldError

log = logging.getLogger("remoting.dispatch")


class Dispatcher:
    """Call it as a RequestHandler: `Connection(stream, Dispatcher({code: handler}), ...)`.

    `batched` maps codes to handlers of several requests at once (remoting.connection.Batching):
    a connection hands them the requests of that code it read in one go. Such a handler answers
    each request on its own, errors in one request's header included; an exception it raises
    answers the whole batch SYSTEM_ERROR."""

    def __init__(
        self,
        handlers: Mapping[int, RequestHandler],
        batched: Mapping[int, BatchHandler] | None = None,
    ) -> None:
        self.handlers = dict(handlers)
        self.batched = dict(batched or {})

    def batch_handler(self, code: int) -> BatchHandler | None:
        return self.batched.get(code)

    async def __call__(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        handler = self.handlers.get(request.code)
        if handler is None:
            log.info("%s sent %s, which is not served", connection.peer, code_name(request.code))
            return request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request type {request.code} not supported",
            )
        try:
            return await handler(request, connection)
        except HeaderFieldError as err:
            log.info("%s: bad %s: %s", connection.peer, code_name(request.code), err)
            return request.response(ResponseCode.SYSTEM_ERROR, str(err))
        except Exception as err:
            log.exception("%s: handling %s failed", connection.peer, code_name(request.code))
            return request.response(ResponseCode.SYSTEM_ERROR, f"{type(err).__name__}: {err}")
