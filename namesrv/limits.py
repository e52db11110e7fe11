"""The name server's bounds and defaults, with their reasons."""

from __future__ import annotations

LISTEN_DEFAULT = "127.0.0.1:9876"  # RocketMQ's name server port
# A broker not heard from for this long is dropped. RocketMQ waits 120 s; our brokers register
# every few seconds and on every role change, so a dead replica leaves routes much sooner.
BROKER_EXPIRY_S_DEFAULT = 10.0
EXPIRY_CHECKS_PER_PERIOD = 10  # the ticker looks this often per expiry period: drops within +10 %
REGISTER_BODY_BYTES_MAX = 8 << 20  # a broker with ~30 000 topics; the frame limit is 16 MiB
TOPICS_PER_BROKER_MAX = 100_000  # topicConfigTable entries read from one registration

assert BROKER_EXPIRY_S_DEFAULT / EXPIRY_CHECKS_PER_PERIOD >= 0.1  # the ticker stays cheap
