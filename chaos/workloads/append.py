"""The append workload: concurrent clients appending unique values through dledger.client,
each call with a deadline, every invocation and completion recorded.

Worker w is process w of the history: it has its own client (its own connections and leader
hint) and issues one append at a time, so its operations never overlap and the order
checker may hold it to the order it issued them. Values are "<w>-<n>", unique in the run.
After an unknown outcome a worker appends the same value once more (as a producer retrying a
timed-out send would), which is how duplicates arise and get counted.
"""

from __future__ import annotations

import random
from collections import Counter

import attrs
import trio

from chaos.history import HistoryWriter, Phase
from dledger.client import AppendFailed, ClientError, OutcomeUnknown, open_client
from dledger.config import Address

WORKERS_DEFAULT = 4
OP_TIMEOUT_S_DEFAULT = 1.0  # an append not answered by then is recorded `info`
RETRY_UNKNOWN_DEFAULT = 0.5  # chance that a worker re-sends a value whose outcome is unknown
PAUSE_AFTER_ERROR_S = 0.01  # a worker whose append did not succeed waits this long first
ERROR_CHARS_MAX = 300


@attrs.define
class AppendWorkload:
    peers: dict[str, Address]
    rng: random.Random
    workers: int = WORKERS_DEFAULT
    op_timeout_s: float = OP_TIMEOUT_S_DEFAULT
    retry_unknown: float = RETRY_UNKNOWN_DEFAULT
    counts: Counter[str] = attrs.field(factory=Counter)  # ok, fail, info: for the progress line

    async def run(self, history: HistoryWriter, stop: trio.Event) -> None:
        """Append until `stop` is set; each worker finishes its operation in flight first."""
        async with trio.open_nursery() as nursery:
            for w in range(self.workers):
                nursery.start_soon(self._worker, w, history, stop, random.Random(self.rng.random()))

    async def _worker(
        self, w: int, history: HistoryWriter, stop: trio.Event, rng: random.Random
    ) -> None:
        seq = 0
        retry: str | None = None
        async with open_client(self.peers, rng=rng) as client:
            while not stop.is_set():
                if retry is not None:
                    value, retry = retry, None
                else:
                    value = f"{w}-{seq}"
                    seq += 1
                history.record(w, Phase.INVOKE, "append", value)
                try:
                    index = await client.append(value.encode(), timeout=self.op_timeout_s)
                except trio.Cancelled:
                    history.record(w, Phase.INFO, "append", value, error="the run was stopped")
                    raise
                except AppendFailed as err:
                    self._complete(history, w, Phase.FAIL, value, err)
                except (OutcomeUnknown, ClientError, trio.TooSlowError) as err:
                    # ClientError other than these two should not reach us; if it does, we
                    # cannot say the append did not happen, so it is `info`, never `fail`
                    self._complete(history, w, Phase.INFO, value, err)
                    if rng.random() < self.retry_unknown:
                        retry = value
                else:
                    self.counts["ok"] += 1
                    history.record(w, Phase.OK, "append", value, index=index, node=client.leader)
                    continue
                await trio.sleep(PAUSE_AFTER_ERROR_S)

    def _complete(
        self, history: HistoryWriter, w: int, phase: Phase, value: str, err: BaseException
    ) -> None:
        self.counts[phase.value] += 1
        text = f"{type(err).__name__}: {err}"[:ERROR_CHARS_MAX]
        history.record(w, phase, "append", value, error=text)
