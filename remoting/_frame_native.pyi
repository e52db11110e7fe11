# The usual frame of FrameDecoder in C: remoting/frame_native.c says what it does.

from collections.abc import Callable
from typing import Any

from remoting.codes import SerializeType
from remoting.command import RemotingCommand

def json_frames(
    buffer: bytearray,
    start: int,
    frame_max: int,
    loads: Callable[[bytes], Any],
    command_type: type[RemotingCommand],
    json: SerializeType,
    other_language: str,
    ext_max: int,
    /,
) -> tuple[list[RemotingCommand], int]: ...
