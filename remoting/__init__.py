"""RocketMQ's remoting protocol, shared by the broker, the name server and the client.

`frame` is the sans-I/O codec (bytes in, `RemotingCommand`s out), `codes` and `headers` name
every code and header field, `connection` is the trio shell around one stream, `server` and
`client` open those connections. Spec: docs/protocol.md#rocketmq-remoting.
"""
