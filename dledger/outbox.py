"""Frames going out on one stream: written at once when the stream is idle, else queued.

Every connection has one task that sends (trio allows one `send_all` at a time per stream).
Waking that task for each frame costs a task switch and a scheduler pass, and a replicated
append crosses three such hops (client to leader, leader to followers, leader back to the
client). So a frame produced while its sender is parked with nothing queued is written to the
socket by the producer itself, without blocking: a lone client's append then takes ~20 % less
time here (docs/decisions.md, "Frames go straight to an idle socket"). Whatever the socket does
not take at once, and every frame produced while the sender is busy, is queued behind it; the
sender sends all that is queued in one `send_all`, so under load nothing changes.
"""

from __future__ import annotations

import trio

from netio.streams import write_nowait


class Outbox:
    """Frames for one stream, and its sender: `run()` in a task, `put()` from any task."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.closed = False
        self._queued: list[bytes] = []
        self._parked = False  # the sender waits for work and nothing is queued
        self._wake = trio.Event()
        self._drained = trio.Event()

    def put(self, frame: bytes) -> None:
        """Send `frame` after every frame put before it."""
        if self.closed:
            return
        if self._parked:
            sent = write_nowait(self.stream, frame)
            if sent == len(frame):
                return
            frame = frame[sent:]
            self._parked = False  # what follows queues behind the rest of this frame
        self._queued.append(frame)
        self._wake.set()

    async def run(self) -> None:
        """Send what is queued until close(). A transport error propagates (and closes)."""
        try:
            while True:
                while not self._queued:
                    if self.closed:
                        return
                    self._parked = True
                    try:
                        await self._wake.wait()
                    finally:
                        self._parked = False
                    self._wake = trio.Event()
                out, self._queued = self._queued, []
                await self.stream.send_all(out[0] if len(out) == 1 else b"".join(out))
                if not self._queued:
                    self._drained.set()
                    self._drained = trio.Event()
        finally:
            self.close()

    async def drained(self) -> None:
        """Return once every frame put so far has been handed to the socket (or we closed)."""
        if self._queued and not self.closed:
            await self._drained.wait()

    def close(self) -> None:
        """Drop what is queued and stop the sender; later frames are dropped."""
        self.closed = True
        self._queued.clear()
        self._parked = False
        self._wake.set()
        self._drained.set()
