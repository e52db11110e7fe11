"""dledger: a Raft-replicated log, run standalone (`dledger-server`) or embedded in a program
that brings its own state machine (the broker). docs/embedding.md shows how.

The embedding API, all importable from here:

- `Node(config, store, state_machine)`: one replica; `run()` drives it until cancelled.
- `host_node(node)`: run a node with the TCP listener its peers connect to.
- `NodeConfig`, `Address`, `parse_peers`: who the replica is and who its peers are.
- `LogStore.open(dir, StoreConfig(...))`, `FlushPolicy`: the disk log the node replicates.
- `StateMachine`: what the node hands committed entries to, as `EntryBatch`es, in order.
- `RoleState`, `Role`: a replica's role, term and leader, handed to `Node.on_role_change`
  listeners and returned by `Node.wait_role_change()` on every change.
- `Status`: the status an append's reply carries (`Node.submit_append`).
"""

from dledger.config import Address, NodeConfig, parse_peers
from dledger.hosting import host_node
from dledger.log.store import FlushPolicy, LogStore, StoreConfig
from dledger.node import AppendReply, Node, StateMachine
from dledger.raft.entries import EntryBatch, EntryKind
from dledger.raft.events import Role, RoleState
from dledger.wire import Status

__all__ = [
    "Address",
    "AppendReply",
    "EntryBatch",
    "EntryKind",
    "FlushPolicy",
    "LogStore",
    "Node",
    "NodeConfig",
    "Role",
    "RoleState",
    "StateMachine",
    "Status",
    "StoreConfig",
    "host_node",
    "parse_peers",
]
