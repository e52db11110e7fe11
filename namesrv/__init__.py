"""The name server: a stateless, share-nothing route registry (`dledger-namesrv`).

`registry` holds the routes and decides every registration (pure: time is passed in),
`bodies` reads and writes the JSON bodies, `service` answers remoting requests, `server` is
the process (CLI, ticker, listener). Spec: docs/protocol.md#name-server.
"""
