"""Chaos: real processes, real faults, a recorded history and checkers that can fail.

- history.py: operations as clients and the nemesis saw them (history.jsonl)
- final.py: what every replica held at the end (final.json)
- checks.py: must-hold checkers, pure functions of the history and the final state
- availability.py: failover times and stalls, from the history alone
- partition.py: partitions as data; net.py applies them (namespaces, veth, iptables)
- schedule.py: scenarios as seeded fault plans; nemesis.py injects them
- targets/: what is under test (dledger now; the broker later)
- workloads/: what clients do (append now)
- report.py, timeline.py, run.py, cli.py: a run end to end, `dledger-chaos run|check|cleanup`
"""
