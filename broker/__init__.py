"""RocketMQ broker on the replicated log: milestone 2."""
