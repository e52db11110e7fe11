"""Hand-made broker-run histories and final reads for the broker checker tests: a few lines
each, so that what a checker must catch is visible in the test."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaos.broker_final import (
    BrokerFinal,
    QueueListing,
    ReplicaRead,
    Slot,
    compare_group,
    queue_key,
)
from chaos.history import NEMESIS, Op, Phase
from chaos.workloads.messages import TOPIC

MS = 1_000_000
HOSTS = ("n0", "n1", "n2")


class BrokerHistory:
    """Operations with a clock that advances 1 ms per record unless told otherwise."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.now_ns = 0

    def at(self, ms: float) -> BrokerHistory:
        self.now_ns = int(ms * MS)
        return self

    def _add(self, op: Op) -> None:
        self.ops.append(op)
        self.now_ns += MS

    def send(
        self,
        process: str,
        value: str,
        *,
        outcome: str = "ok",
        group: str = "broker-a",
        queue: int = 0,
        offset: int = 0,
        topic: str = TOPIC,
        key: str | None = None,
        took_ms: float = 1.0,
    ) -> BrokerHistory:
        asked = {"v": value, "t": topic, "k": key, "id": f"ID-{value}"}
        self._add(Op(process, Phase.INVOKE, "send", asked, self.now_ns, group=""))
        self.now_ns += int((took_ms - 1) * MS)
        phase = Phase(outcome)
        if phase is Phase.OK:
            done = Op(
                process,
                phase,
                "send",
                {**asked, "q": queue, "o": offset, "status": "SEND_OK"},
                self.now_ns,
                group=group,
                node="n0",
            )
        else:
            done = Op(process, phase, "send", asked, self.now_ns, group="", error="boom")
        self._add(done)
        return self

    def consume(
        self,
        member: str,
        cg: str,
        rows: Sequence[tuple[int, str]],
        *,
        group: str = "broker-a",
        queue: int = 0,
        topic: str = TOPIC,
    ) -> BrokerHistory:
        value = {"cg": cg, "t": topic, "q": queue, "m": [[o, v, f"ID-{v}"] for o, v in rows]}
        self._add(Op(member, Phase.OK, "consume", value, self.now_ns, group=group))
        return self

    def take(
        self, member: str, cg: str, *, group: str = "broker-a", queue: int = 0, topic: str = TOPIC
    ) -> BrokerHistory:
        value = {"cg": cg, "t": topic, "q": queue}
        self._add(Op(member, Phase.OK, "take", value, self.now_ns, group=group))
        return self

    def committed(
        self, cg: str, offset: int, *, group: str = "broker-a", queue: int = 0, topic: str = TOPIC
    ) -> BrokerHistory:
        value = {"cg": cg, "t": topic, "q": queue, "o": offset}
        self._add(Op("offsets", Phase.OK, "committed", value, self.now_ns, group=group))
        return self

    def restart(self, member: str, cg: str) -> BrokerHistory:
        value = {"cg": cg, "member": member, "commit": True}
        self._add(Op(member, Phase.OK, "restart", value, self.now_ns, group=""))
        return self

    def fault(
        self,
        kind: str,
        f: str,
        *,
        group: str | None = "broker-a",
        phase: str = "invoke",
        leader: str | None = "n0",
        **extra: Any,
    ) -> BrokerHistory:
        value = {
            "fault": kind,
            "group": group,
            "leader": leader,
            "leader_affected": True,
            "nodes": [leader or "namesrv-0"],
            **extra,
        }
        self._add(Op(NEMESIS, Phase(phase), f, value, self.now_ns))
        return self


def listing(values: Sequence[str], first: int = 0) -> QueueListing:
    """A queue holding `values` from offset `first` on, positions made up from the offsets."""
    slots = tuple(Slot(first + i, v, f"ID-{v}", 1000 * (first + i)) for i, v in enumerate(values))
    return QueueListing(first, first + len(values), slots)


def final_of(
    groups: Mapping[str, Mapping[str, Sequence[str]]],
    *,
    replicas: Mapping[str, Mapping[str, QueueListing]] | None = None,
    converged: bool = True,
    crashes: Sequence[dict[str, Any]] = (),
) -> BrokerFinal:
    """Every group's replicas n0 (leader), n1, n2 holding the same queues, {"ChaosTopic/0":
    [values], ...}, unless `replicas` gives some replica ("broker-a/n1") its own listings."""
    out = {}
    for group, queues in groups.items():
        same = {key: listing(values) for key, values in queues.items()}
        listings = {h: dict((replicas or {}).get(f"{group}/{h}", same)) for h in HOSTS}
        states = {
            h: ReplicaRead(h, role="leader" if h == "n0" else "follower", applied_index=10)
            for h in HOSTS
        }
        out[group] = compare_group(group, listings, states)
    return BrokerFinal(groups=out, complete=True, converged=converged, crashes=tuple(crashes))


def key(queue: int = 0, topic: str = TOPIC) -> str:
    return queue_key(topic, queue)
