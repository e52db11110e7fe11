"""timeline.png: ok appends per 100 ms over the run (a broker run: SEND_OKs and consumptions
per group), with every fault window shaded and labelled by its kind (matplotlib's object API
with the Agg canvas: no pyplot, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from chaos.availability import FaultWindow, fault_windows, ok_appends
from chaos.history import Op

BIN_S = 0.1
FIGURE_INCHES = (14, 4.5)
DPI = 110
COLORS = {  # by the history's `f`
    "kill": "tab:red",
    "pause": "tab:orange",
    "partition": "tab:blue",
    "restart": "tab:purple",
    "disk": "tab:brown",
    "namesrv": "tab:green",
    "transfer": "tab:pink",
}


def bins(history: Sequence[Op]) -> tuple[list[float], list[int]]:
    """(bin start seconds, ok appends completed in that bin) over the whole history."""
    end_ns = max((op.time_ns for op in history), default=0)
    count = int(end_ns / 1e9 / BIN_S) + 1
    per_bin = [0] * count
    for op in ok_appends(history):
        per_bin[min(count - 1, int(op.time_ns / 1e9 / BIN_S))] += 1
    return [i * BIN_S for i in range(count)], per_bin


def draw(path: Path, history: Sequence[Op]) -> None:
    xs, ys = bins(history)
    end_s = xs[-1] + BIN_S if xs else 0.0
    fig = Figure(figsize=FIGURE_INCHES)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.step(xs, ys, where="post", color="black", linewidth=0.8, label="ok appends / 100 ms")
    top = max(ys, default=1) or 1
    labelled: set[str] = set()
    for w in fault_windows(history):
        start = w.start_ns / 1e9
        stop = w.end_ns / 1e9 if w.end_ns is not None else end_s
        color = COLORS.get(w.f, "tab:gray")
        ax.axvspan(start, stop, color=color, alpha=0.25, label=None if w.f in labelled else w.f)
        labelled.add(w.f)
        ax.text(start, top * 1.02, w.kind, rotation=90, fontsize=6, va="bottom", ha="left")
    ax.set_xlim(0, end_s)
    ax.set_ylim(0, top * 1.35)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("ok appends per 100 ms")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)


def draw_series(
    path: Path,
    series: dict[str, list[int]],
    end_s: float,
    windows: Sequence[FaultWindow],
    unit: str,
) -> None:
    """Counts per BIN_S of a broker run, in two panels over one time axis: SEND_OKs per
    broker group ("sent ok ..." series) above, consumptions per consumer group below (a
    consumer catching up after a fault would flatten the sends on a shared scale); every
    fault window shaded in both, labelled by its kind and the broker group it hit."""
    fig = Figure(figsize=(FIGURE_INCHES[0], FIGURE_INCHES[1] * 1.6))
    FigureCanvasAgg(fig)
    top_ax, bottom_ax = fig.subplots(2, 1, sharex=True)
    panels = [
        (top_ax, {n: c for n, c in series.items() if n.startswith("sent")}, "SEND_OK"),
        (bottom_ax, {n: c for n, c in series.items() if not n.startswith("sent")}, "consumed"),
    ]
    for ax, shown, what in panels:
        top = 1
        for name, counts in shown.items():
            xs = [i * BIN_S for i in range(len(counts))]
            ax.step(xs, counts, where="post", linewidth=0.8, label=f"{name} {unit}")
            top = max(top, max(counts, default=0))
        labelled: set[str] = set()
        for w in windows:
            start = w.start_ns / 1e9
            stop = w.end_ns / 1e9 if w.end_ns is not None else end_s
            color = COLORS.get(w.f, "tab:gray")
            ax.axvspan(start, stop, color=color, alpha=0.2, label=None if w.f in labelled else w.f)
            labelled.add(w.f)
            if ax is top_ax:
                label = f"{w.kind} {w.value.get('group') or ''}".strip()
                ax.text(start, top * 1.02, label, rotation=90, fontsize=6, va="bottom", ha="left")
        ax.set_xlim(0, end_s)
        ax.set_ylim(0, top * (1.6 if ax is top_ax else 1.1))
        ax.set_ylabel(f"{what} {unit}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)
    bottom_ax.set_xlabel("seconds since the workload started")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
