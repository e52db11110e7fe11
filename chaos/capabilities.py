"""What a chaos run needs from this machine, checked before anything starts, so that a run
either tests what it says or refuses with the exact thing that is missing (exit 2). A weaker
test (say, partitions without network isolation) is never run in its place.

Needed: root (network namespaces, veth, bridges and iptables want CAP_NET_ADMIN and
CAP_SYS_ADMIN), `ip` (iproute2) and `iptables`/`iptables-restore` on PATH, and a kernel that
lets us create a namespace with a bridge and a veth pair, add an iptables chain inside it and
enter it with setns. Optional: tc netem (delay and loss on links); when the kernel lacks it
the run says so and draws no netem faults.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import attrs

from chaos import commands
from chaos.net import CHAIN, NAME_PREFIX, entered_namespace

TOOLS = {
    "ip": "iproute2",
    "iptables": "iptables",
    "iptables-restore": "iptables",
}


@attrs.frozen
class Capabilities:
    missing: tuple[str, ...]  # each a sentence: what is missing and how to get it
    netem: str | None  # None when tc netem works, else why not

    @property
    def ok(self) -> bool:
        return not self.missing

    def explain(self) -> str:
        lines = [f"chaos cannot run here: {m}" for m in self.missing]
        return "\n".join(lines)


def check(
    run_id: str,
    *,
    euid: Callable[[], int] = os.geteuid,
    which: Callable[[str], str | None] = shutil.which,
) -> Capabilities:
    missing: list[str] = []
    if euid() != 0:
        missing.append(
            "root: network namespaces, veth pairs, bridges and iptables need CAP_NET_ADMIN "
            "and CAP_SYS_ADMIN; run dledger-chaos as root (e.g. sudo)"
        )
    for tool, package in TOOLS.items():
        if which(tool) is None:
            missing.append(
                f"`{tool}` not found on PATH: install the {package} package "
                f"(./dev.sh installs it: apt-get install {package})"
            )
    if missing:
        return Capabilities(tuple(missing), netem="not checked")
    probe = f"{NAME_PREFIX}-{run_id}-probe"
    netem: str | None = "not checked"
    try:
        missing.extend(_probe_kernel(probe))
        if not missing:
            netem = _probe_netem(probe, which)
    finally:
        commands.run(["ip", "netns", "del", probe], check=False)
    return Capabilities(tuple(missing), netem)


def _probe_kernel(probe: str) -> list[str]:
    """Each step a run relies on, in a scratch namespace; the first failure is reported."""
    drop = f"*filter\n-A {CHAIN} -s 10.0.0.1/32 -j DROP\nCOMMIT\n"
    steps: list[tuple[str, list[str], str | None]] = [
        ("network namespaces", ["ip", "netns", "add", probe], None),
        ("bridges", ["ip", "-n", probe, "link", "add", "pbr0", "type", "bridge"], None),
        (
            "veth pairs",
            ["ip", "-n", probe, "link", "add", "pv0", "type", "veth", "peer", "name", "pv1"],
            None,
        ),
        (
            "attaching a veth to a bridge",
            ["ip", "-n", probe, "link", "set", "pv0", "master", "pbr0"],
            None,
        ),
        (
            "iptables inside a namespace",
            ["ip", "netns", "exec", probe, "iptables", "-w", "-N", CHAIN],
            None,
        ),
        (
            "iptables-restore inside a namespace",
            ["ip", "netns", "exec", probe, "iptables-restore", "-w", "--noflush"],
            drop,
        ),
    ]
    for what, argv, stdin in steps:
        try:
            commands.run(argv, stdin=stdin)
        except commands.CommandFailed as err:
            return [f"{what}: {err}"]
    try:
        with entered_namespace(probe):
            pass
    except OSError as err:
        return [f"entering a namespace (setns(CLONE_NEWNET)): {err}"]
    return []


def _probe_netem(probe: str, which: Callable[[str], str | None]) -> str | None:
    if which("tc") is None:
        return "`tc` not found on PATH (iproute2)"
    try:
        commands.run(
            [
                "ip",
                "netns",
                "exec",
                probe,
                "tc",
                "qdisc",
                "add",
                "dev",
                "pv0",
                "root",
                "netem",
                "delay",
                "1ms",
            ]
        )
    except commands.CommandFailed as err:
        return f"the kernel has no tc netem qdisc ({err.output.strip()})"
    return None
