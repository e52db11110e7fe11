"""What `mqbench` counts and how it prints it: one window per second and one for the whole run.

Every event is added to both the current second's window and the run's; the reporter takes the
second's window once a second (and starts a fresh one) and prints it, the summary prints the
run's. Lines are RocketMQ's benchmark lines (benchmark/producer.sh, consumer.sh); `--json`
prints the same numbers as one JSON object per line, `"type": "second"` or `"summary"`.
"""

from __future__ import annotations

import math
from typing import Any

import attrs


@attrs.define
class Latency:
    """Count, sum and maximum of some latencies, in milliseconds."""

    count: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0

    def add(self, ms: float) -> None:
        self.count += 1
        self.total_ms += ms
        self.max_ms = max(self.max_ms, ms)

    @property
    def avg_ms(self) -> float:
        return self.total_ms / self.count if self.count else 0.0


# --- the producer ---------------------------------------------------------------------------------


@attrs.define
class SendWindow:
    """Sends of one second, or of the whole run. `stored` counts messages (a batch counts each
    of its messages), `rt` one latency per request (a batch is one request)."""

    stored: int = 0
    rt: Latency = attrs.field(factory=Latency)
    send_failed: int = 0  # messages whose send raised anything but a broker's refusal
    response_failed: int = 0  # messages a broker refused (MQBrokerError)


class SendStats:
    def __init__(self) -> None:
        self.total = SendWindow()
        self.second = SendWindow()

    def stored(self, messages: int, rt_ms: float) -> None:
        for window in (self.total, self.second):
            window.stored += messages
            window.rt.add(rt_ms)

    def send_failed(self, messages: int) -> None:
        self.total.send_failed += messages
        self.second.send_failed += messages

    def response_failed(self, messages: int) -> None:
        self.total.response_failed += messages
        self.second.response_failed += messages

    def take_second(self) -> SendWindow:
        window, self.second = self.second, SendWindow()
        return window


def send_fields(window: SendWindow, elapsed_s: float) -> dict[str, Any]:
    """The numbers of a window as the JSON object's fields."""
    return {
        "stored": window.stored,
        "send_tps": _rate(window.stored, elapsed_s),
        "rt_ms_avg": round(window.rt.avg_ms, 3),
        "rt_ms_max": round(window.rt.max_ms, 3),
        "send_failed": window.send_failed,
        "response_failed": window.response_failed,
    }


def send_line(window: SendWindow, elapsed_s: float) -> str:
    """RocketMQ's producer line: `Send TPS: 1234 Max RT(ms): 56 Average RT(ms): 3.214 ...`."""
    return (
        f"Send TPS: {_rate(window.stored, elapsed_s):.0f} Max RT(ms): {_ms(window.rt.max_ms)} "
        f"Average RT(ms): {window.rt.avg_ms:.3f} Send Failed: {window.send_failed} "
        f"Response Failed: {window.response_failed}"
    )


def send_summary_line(window: SendWindow, elapsed_s: float) -> str:
    return (
        f"[Summary] Send Total: {window.stored} "
        + send_line(window, elapsed_s)
        + (f" Duration(s): {elapsed_s:.1f}")
    )


# --- the consumer ---------------------------------------------------------------------------------


@attrs.define
class ReceiveWindow:
    """Messages received in one second, or in the whole run: `born_to_receive` from the
    producer's born timestamp to the listener (B2C), `store_to_receive` from the broker's store
    timestamp (S2C), both on this host's clock against theirs."""

    born_to_receive: Latency = attrs.field(factory=Latency)
    store_to_receive: Latency = attrs.field(factory=Latency)

    @property
    def received(self) -> int:
        return self.born_to_receive.count


class ReceiveStats:
    def __init__(self) -> None:
        self.total = ReceiveWindow()
        self.second = ReceiveWindow()

    def received(self, born_to_receive_ms: float, store_to_receive_ms: float) -> None:
        for window in (self.total, self.second):
            window.born_to_receive.add(born_to_receive_ms)
            window.store_to_receive.add(store_to_receive_ms)

    def take_second(self) -> ReceiveWindow:
        window, self.second = self.second, ReceiveWindow()
        return window


def receive_fields(window: ReceiveWindow, elapsed_s: float) -> dict[str, Any]:
    b2c, s2c = window.born_to_receive, window.store_to_receive
    return {
        "received": window.received,
        "receive_tps": _rate(window.received, elapsed_s),
        "b2c_ms_avg": round(b2c.avg_ms, 3),
        "b2c_ms_max": round(b2c.max_ms, 3),
        "s2c_ms_avg": round(s2c.avg_ms, 3),
        "s2c_ms_max": round(s2c.max_ms, 3),
    }


def receive_line(window: ReceiveWindow, elapsed_s: float) -> str:
    """RocketMQ's consumer line, born-to-consume (B2C) and store-to-consume (S2C) RT."""
    b2c, s2c = window.born_to_receive, window.store_to_receive
    return (
        f"Receive TPS: {_rate(window.received, elapsed_s):.0f} "
        f"Average(B2C) RT(ms): {b2c.avg_ms:.3f} Max(B2C) RT(ms): {_ms(b2c.max_ms)} "
        f"Average(S2C) RT(ms): {s2c.avg_ms:.3f} Max(S2C) RT(ms): {_ms(s2c.max_ms)}"
    )


def receive_summary_line(window: ReceiveWindow, elapsed_s: float) -> str:
    return (
        f"[Summary] Receive Total: {window.received} "
        + receive_line(window, elapsed_s)
        + (f" Duration(s): {elapsed_s:.1f}")
    )


def _rate(count: int, elapsed_s: float) -> float:
    return round(count / elapsed_s, 1) if elapsed_s > 0 else 0.0


def _ms(ms: float) -> int:
    """A maximum in whole milliseconds, rounded up, as RocketMQ prints it (a 0.3 ms RT is 1)."""
    return math.ceil(ms)
