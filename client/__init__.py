"""A pure-Python RocketMQ 4.x client: it works against our brokers and any RocketMQ 4.x broker.

client/instance.py is what every producer and consumer runs on (routes from any namesrv,
one connection per broker address, heartbeats); client/blocking.py runs the trio API on a
thread of its own for the blocking API. The DLedger client is dledger.client.
"""

from client.listeners import ConsumeOrderlyStatus, ConsumeStatus
from client.message import MessageExt, MessageQueue
from client.pull_consumer import AsyncPullConsumer, PullConsumer, PullResult, PullStatus
from client.push_consumer import AsyncPushConsumer, PushConsumer
from client.rebalance import ConsistentHash, allocate_averagely

__all__ = [
    "AsyncPullConsumer",
    "AsyncPushConsumer",
    "ConsistentHash",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "MessageExt",
    "MessageQueue",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "allocate_averagely",
]
