"""A pure-Python RocketMQ 4.x client: it works against our brokers and any RocketMQ 4.x broker.

client/instance.py is what every producer and consumer runs on (routes from any namesrv,
one connection per broker address, heartbeats); client/blocking.py runs the trio API on a
thread of its own for the blocking API. The DLedger client is dledger.client.
"""
