"""docs/embedding.md's example, run as written: three replicas of the word counter in one trio
process on 127.0.0.1, a few appends through the leader, every replica counting the same."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import trio

from dledger import Role
from dledger.processes import free_port_block

DOC = Path(__file__).parents[2] / "docs" / "embedding.md"


def doc_namespace() -> dict[str, Any]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 2, "the page shows the state machine and the append"
    namespace: dict[str, Any] = {"__name__": "embedding_doc"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    return namespace


def test_the_example_is_about_twenty_lines() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    lines = [line for line in blocks[0].splitlines() if line.strip() and "import" not in line]
    assert len(lines) <= 25, len(lines)


async def test_three_replicas_of_the_example_agree(tmp_path: Path) -> None:
    ns = doc_namespace()
    first = free_port_block(3)  # distinct: free_port() twice may give the same port
    peers = ";".join(f"n{i}-127.0.0.1:{first + i}" for i in range(3))
    machines = {f"n{i}": ns["WordCount"]() for i in range(3)}
    async with trio.open_nursery() as nursery:
        nodes = {
            n: await nursery.start(ns["replica"], n, peers, tmp_path, m)
            for n, m in machines.items()
        }
        with trio.fail_after(20):
            while not any(node.role.role is Role.LEADER for node in nodes.values()):
                await trio.sleep(0.01)
        leader = next(node for node in nodes.values() if node.role.role is Role.LEADER)
        indexes = [await ns["count_words"](leader, text) for text in ("a b c", "d e", "f")]
        assert indexes == sorted(indexes)
        follower = next(node for node in nodes.values() if node is not leader)
        refused = await follower.append([b"x"])
        assert (
            refused.status.name == "NOT_LEADER"
            and refused.fields["leader"] == leader.config.self_id
        )
        with trio.fail_after(20):
            while any(m.words < 6 for m in machines.values()):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert [m.words for m in machines.values()] == [6, 6, 6]
