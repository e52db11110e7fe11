"""Progress on stderr for long audits: what step runs, and tasks done per active stage.

Spark's own console bar needs the UI, which the audit keeps off (nothing listens); this polls
the status tracker instead, from one daemon thread that the caller stops.
"""

from __future__ import annotations

import sys
import threading
import time

from pyspark import SparkContext

PROGRESS_INTERVAL_S = 2.0  # how often active stages are reported while they change


class Progress:
    """Prints `step` lines and, while Spark stages run, their task counts."""

    def __init__(self, sc: SparkContext, *, quiet: bool = False) -> None:
        self._sc = sc
        self._quiet = quiet
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._poll, name="audit-progress", daemon=True)

    def __enter__(self) -> Progress:
        if not self._quiet:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=PROGRESS_INTERVAL_S * 2)

    def step(self, message: str) -> None:
        if not self._quiet:
            print(f"[audit {time.monotonic() - self._started:6.1f}s] {message}", file=sys.stderr)

    def _poll(self) -> None:
        last = ""
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            tracker = self._sc.statusTracker()
            parts, waiting = [], 0
            for stage_id in sorted(tracker.getActiveStageIds()):
                info = tracker.getStageInfo(stage_id)
                if info is None:
                    continue
                if info.numActiveTasks == 0 and info.numCompletedTasks == 0:
                    waiting += 1  # submitted, waiting for its inputs or for a core
                    continue
                parts.append(
                    f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks done"
                )
            if waiting:
                parts.append(f"{waiting} stages waiting")
            line = "; ".join(parts)
            if line and line != last:
                self.step(line)
                last = line
