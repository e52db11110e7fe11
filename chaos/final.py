"""What the replicas held at the end of a run, read back after the last fault healed and a
quiet period passed; saved as `final.json` beside the history so that `dledger-chaos check`
judges a saved run exactly as the run did.

    {"complete": true, "converged": true, "problems": [],
     "replicas": {"n0": {"commit_index": 9, "last_index": 9, "first_index": 1, "term": 3,
                         "role": "leader", "error": null,
                         "committed": [[index, term, kind, body], ...],
                         "uncommitted": [[index, term, kind, body], ...]}, ...}}

A body is its UTF-8 text, or {"b64": "..."} when it is not UTF-8 (config entries).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import attrs

FINAL_FILE = "final.json"
KIND_DATA = 0  # dledger.raft.entries.EntryKind.DATA: only these carry workload values


@attrs.frozen
class LogEntry:
    index: int
    term: int
    kind: int
    body: bytes

    @property
    def value(self) -> str | None:
        """The workload value this entry carries, if it is a data entry of UTF-8 text."""
        if self.kind != KIND_DATA:
            return None
        try:
            return self.body.decode()
        except UnicodeDecodeError:
            return None


@attrs.frozen
class ReplicaLog:
    node: str
    committed: tuple[LogEntry, ...] = ()
    uncommitted: tuple[LogEntry, ...] = ()
    commit_index: int = 0
    last_index: int = 0
    first_index: int = 1
    term: int = 0
    role: str = "unknown"
    error: str | None = None  # why it could not be read; then the lists are empty

    @property
    def read(self) -> bool:
        return self.error is None


@attrs.frozen
class FinalState:
    replicas: dict[str, ReplicaLog]
    complete: bool  # every replica was read
    converged: bool = False  # they had reached the same commit index before the read
    problems: tuple[str, ...] = ()  # what stood in the way of a complete read
    crashes: tuple[dict[str, Any], ...] = ()  # replicas that exited unbidden (targets.base.Crash)


NO_FINAL_READ = FinalState(replicas={}, complete=False, problems=("no final read",))


def _encode_body(body: bytes) -> str | dict[str, str]:
    try:
        return body.decode()
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(body).decode()}


def _decode_body(raw: Any) -> bytes:
    if isinstance(raw, str):
        return raw.encode()
    if isinstance(raw, dict) and isinstance(raw.get("b64"), str):
        return base64.b64decode(raw["b64"])
    raise ValueError(f"bad body {raw!r}")


def _rows(entries: tuple[LogEntry, ...]) -> list[list[Any]]:
    return [[e.index, e.term, e.kind, _encode_body(e.body)] for e in entries]


def _entries(rows: list[list[Any]]) -> tuple[LogEntry, ...]:
    return tuple(LogEntry(int(i), int(t), int(k), _decode_body(b)) for i, t, k, b in rows)


def to_json(state: FinalState) -> dict[str, Any]:
    return {
        "complete": state.complete,
        "converged": state.converged,
        "problems": list(state.problems),
        "crashes": list(state.crashes),
        "replicas": {
            node: {
                "commit_index": r.commit_index,
                "last_index": r.last_index,
                "first_index": r.first_index,
                "term": r.term,
                "role": r.role,
                "error": r.error,
                "committed": _rows(r.committed),
                "uncommitted": _rows(r.uncommitted),
            }
            for node, r in sorted(state.replicas.items())
        },
    }


def from_json(data: dict[str, Any]) -> FinalState:
    replicas = {
        node: ReplicaLog(
            node=node,
            committed=_entries(r["committed"]),
            uncommitted=_entries(r["uncommitted"]),
            commit_index=int(r["commit_index"]),
            last_index=int(r["last_index"]),
            first_index=int(r["first_index"]),
            term=int(r["term"]),
            role=str(r["role"]),
            error=r["error"],
        )
        for node, r in data["replicas"].items()
    }
    return FinalState(
        replicas=replicas,
        complete=bool(data["complete"]),
        converged=bool(data.get("converged", False)),
        problems=tuple(data.get("problems", ())),
        crashes=tuple(data.get("crashes", ())),
    )


def save(path: Path, state: FinalState) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(to_json(state), separators=(",", ":")))
    tmp.replace(path)


def load(path: Path) -> FinalState:
    """The saved final state; NO_FINAL_READ when the run never got to read it."""
    if not path.exists():
        return NO_FINAL_READ
    return from_json(json.loads(path.read_text()))
