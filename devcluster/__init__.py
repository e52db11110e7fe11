"""`dledger-dev`: the one-command local cluster (devcluster/cli.py).

A program on top of every package: it starts broker groups and name servers through
`broker.localcluster` and milestone 1's bare dledger groups through `dledger.localgroup`, so it
lives above both rather than inside `dledger/`, which the broker is built on.
"""
