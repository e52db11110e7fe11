"""Tests of client/: the producer against fake brokers and against a real local cluster."""
