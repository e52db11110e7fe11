"""A pure-Python RocketMQ 4.x client: it works against our brokers and any RocketMQ 4.x broker.

client/instance.py is what every producer and consumer runs on (routes from any namesrv,
one connection per broker address, heartbeats); client/blocking.py runs the trio API on a
thread of its own for the blocking API. The producer: client/producer.py (trio) and
client/blocking_producer.py (blocking), docs/client.md. The consumers: client/pull_consumer.py
and client/push_consumer.py, docs/client-consumers.md. The DLedger client is dledger.client.
"""

from client.blocking_producer import Producer
from client.errors import (
    BrokerUnreachable,
    ClientClosed,
    InvalidMessage,
    MQBrokerError,
    MQClientError,
    NoRouteError,
    SendOutcomeUnknown,
)
from client.listeners import ConsumeOrderlyStatus, ConsumeStatus
from client.message import Message, MessageExt, MessageQueue
from client.producer import AsyncProducer
from client.pull_consumer import AsyncPullConsumer, PullConsumer, PullResult, PullStatus
from client.push_consumer import AsyncPushConsumer, PushConsumer
from client.rebalance import ConsistentHash, allocate_averagely
from client.selectors import hash_selector
from client.send_result import SendResult, SendStatus

__all__ = [
    "AsyncProducer",
    "AsyncPullConsumer",
    "AsyncPushConsumer",
    "BrokerUnreachable",
    "ClientClosed",
    "ConsistentHash",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "InvalidMessage",
    "MQBrokerError",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageQueue",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "SendOutcomeUnknown",
    "SendResult",
    "SendStatus",
    "allocate_averagely",
    "hash_selector",
]
