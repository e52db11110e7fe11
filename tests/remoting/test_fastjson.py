"""remoting/fastjson.py: maps with object keys and bare numeric keys, as Java writes them."""

from __future__ import annotations

import json

import pytest

from remoting import fastjson
from remoting.fastjson import FastjsonError, ObjectKeyed


def test_object_keys_round_trip() -> None:
    """A map keyed by MessageQueue objects is written as fastjson does and read back."""
    mq = {"brokerName": "broker-a", "queueId": 0, "topic": "T"}
    value = {"offsetTable": ObjectKeyed.of([(mq, {"maxOffset": 3})]), "consumeTps": 0.5}
    text = fastjson.dumps(value)
    assert text == (
        '{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"maxOffset":3}},'
        '"consumeTps":0.5}'
    )
    assert fastjson.loads(text) == value


def test_standard_json_reads_as_json() -> None:
    text = '{"a": [1, 2.5, "x", null, true, {}], "b": {"c": "d"}}'
    assert fastjson.loads(text) == json.loads(text)


def test_bare_numeric_keys_read_as_text() -> None:
    """A Java name server writes brokerAddrs as {0:"..."}."""
    assert fastjson.loads('{"brokerAddrs":{0:"127.0.0.1:10911", 1 : "b"}}') == {
        "brokerAddrs": {"0": "127.0.0.1:10911", "1": "b"}
    }


@pytest.mark.parametrize(
    "text",
    ['{"a" 1}', '{"a":1', "[1 2]", '{"a":1} x', "", "{{}}", '{"a":1,}', "[" * 100 + "]" * 100],
)
def test_malformed_text_raises(text: str) -> None:
    with pytest.raises(FastjsonError):
        fastjson.loads(text)
