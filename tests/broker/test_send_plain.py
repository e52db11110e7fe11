"""The send handler's fast look at a message's properties (broker/send.py `_plain`): when it says
plain, the four looks it stands for (a half message, a delay or SOURCE, a commit offset to
strip, a CLUSTER the client set) would each have found nothing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from broker import delays, send
from broker.config import BrokerConfig
from broker.context import Broker
from broker.metadata import PERM_READ, PERM_WRITE, TopicConfig
from broker.send import _plain
from broker.transactions import HALF_OFFSET, is_half, strip_half_offset
from dledger.config import Address
from remoting import properties as props
from remoting import stored_message
from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.headers import SendMessageRequestHeader, header_specs

KEYS = [
    props.TRAN_MSG,
    props.CLUSTER,
    HALF_OFFSET,
    delays.SOURCE,
    "DELAY",
    "__STARTDELIVERTIME",
    "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS",
    "UNIQ_KEY",
    "KEYS",
    "TAGS",
    "WAIT",
]
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
    min_size=1,
    max_size=20,
)
VALUES = st.one_of(st.sampled_from(["true", "TRUE", "false", "3", "1000"]), TEXT)


def looks_find_nothing(data: bytes) -> bool:
    return (
        not is_half(data, 0)
        and not delays.needs_look(data)
        and strip_half_offset(data) == data
        and props.find(data, b"CLUSTER") is None
    )


@given(st.dictionaries(st.one_of(st.sampled_from(KEYS), TEXT), VALUES, max_size=6))
def test_plain_properties_hold_nothing_the_four_looks_would_find(values: dict[str, str]) -> None:
    data = props.encode(values)
    if _plain(data):
        assert looks_find_nothing(data)
    else:  # it may only be cautious where one of the markers occurs
        assert any(k.encode() in data for k in KEYS[:7]) or b"TIMER_" in data


@given(st.binary(max_size=200))
def test_plain_holds_for_any_bytes(data: bytes) -> None:
    if _plain(data):
        assert looks_find_nothing(data)


def test_each_special_property_is_not_plain() -> None:
    for values in (
        {props.TRAN_MSG: "true"},
        {props.CLUSTER: "DefaultCluster"},
        {HALF_OFFSET: "12"},
        {"DELAY": "3"},
        {"__STARTDELIVERTIME": "1000"},
        {"TIMER_DELAY_SEC": "5"},
        {delays.SOURCE: "x"},
    ):
        assert not _plain(props.encode(values | {"UNIQ_KEY": "7F0000010001"})), values
    assert _plain(props.encode({"UNIQ_KEY": "7F0000010001", "WAIT": "true", "TAGS": "a"}))


# --- the usual send made in C (send._prepare_plain) against the general path (_prepare_any) ---

FAST_TOPICS = ["Plain", "ReadOnly", "Missing", "%RETRY%g", "RMQ_SYS_TRANS_HALF_TOPIC", "bad topic"]
FIXED_NOW_MS = 1_700_000_000_123
STANDARD = {
    "producerGroup": "pg",
    "topic": "Plain",
    "defaultTopic": "TBW102",
    "defaultTopicQueueNums": "4",
    "queueId": "1",
    "sysFlag": "0",
    "bornTimestamp": "1700000000000",
    "flag": "0",
    "properties": props.encode({"UNIQ_KEY": "AB01", "TAGS": "t", "KEYS": "k1 k2"}).decode(),
    "reconsumeTimes": "0",
    "unitMode": "false",
}
NUMBERS = st.one_of(  # as clients write them, or not
    st.sampled_from(["0", "1", "3", "007"]),
    st.sampled_from(["4", "-1", "", "x", "2147483648", "9" * 18, "9" * 19]),
)
FIELD_VALUES = {
    "producerGroup": st.sampled_from(["pg", ""]),
    "topic": st.sampled_from(FAST_TOPICS),
    "defaultTopic": st.sampled_from(["TBW102", "Nope"]),
    "defaultTopicQueueNums": NUMBERS,
    "queueId": NUMBERS,
    "sysFlag": st.sampled_from(["0", "1", "4", "8", "12", "48", "2147483648", "x"]),
    "bornTimestamp": NUMBERS,
    "flag": NUMBERS,
    "properties": st.one_of(
        st.just(""),
        st.dictionaries(
            st.sampled_from(["UNIQ_KEY", "TAGS", "KEYS", *KEYS[:7], "DELAY", "x" * 40]),
            st.sampled_from(["a", "1", "true", "é", "z" * 300, "\ud800"]),
            max_size=4,
        ).map(lambda d: "".join(f"{k}\x01{v}\x02" for k, v in d.items())),
    ),
    "reconsumeTimes": NUMBERS,
    "unitMode": st.sampled_from(["true", "false", "1", "maybe"]),
    "maxReconsumeTimes": NUMBERS,
    "batch": st.sampled_from(["false", "true", "0", "1"]),
}


CHANGES = st.dictionaries(
    st.sampled_from(sorted(FIELD_VALUES)),
    st.sampled_from([None, 0, 0, 0]),  # None: the field left out; 0: a drawn value
    max_size=4,
)
CODES = st.sampled_from([RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2])
BODIES = st.sampled_from([b"", b"hello", b"x" * 5000])


def drawn_request(
    changes: dict[str, int | None], data: st.DataObject, code: int, body: bytes
) -> RemotingCommand:
    """STANDARD's send with `changes` (fields left out or drawn from FIELD_VALUES), its field
    names as `code` writes them."""
    fields: dict[str, str] = dict(STANDARD)
    for name, change in changes.items():
        if change is None:
            fields.pop(name, None)
        else:
            fields[name] = data.draw(FIELD_VALUES[name], label=name)
    if code == RequestCode.SEND_MESSAGE_V2:
        wires = dict(
            (long, short)
            for (_, long, _, _), (_, short, _, _) in zip(
                header_specs(SendMessageRequestHeader, False),
                header_specs(SendMessageRequestHeader, True),
                strict=True,
            )
        )
        fields = {wires[k]: v for k, v in fields.items()}
    return RemotingCommand.request(code, fields, body)


def fake_broker(notes: list[tuple[bytes, tuple[object, ...]]], message_bytes_max: int) -> Any:
    config = BrokerConfig(
        group="broker-a", self_id="n0", peers={"n0": Address("127.0.0.1", 40911)},
        listen=Address("127.0.0.1", 10911), store_root=Path("/nonexistent"), namesrv=(),
        message_bytes_max=message_bytes_max,
    )  # fmt: skip
    topics = {
        "Plain": TopicConfig("Plain", 4, 4, PERM_READ | PERM_WRITE),
        "ReadOnly": TopicConfig("ReadOnly", 4, 4, PERM_READ),
        "%RETRY%g": TopicConfig("%RETRY%g", 1, 1, PERM_READ | PERM_WRITE),
        "RMQ_SYS_TRANS_HALF_TOPIC": TopicConfig("RMQ_SYS_TRANS_HALF_TOPIC", 1, 1, 6),
    }
    state = SimpleNamespace(
        metadata=SimpleNamespace(
            topics=topics, groups={}, transactions=SimpleNamespace(pending={})
        ),
        wants_packed=True,
        note_packed=lambda record, fields: notes.append((record, fields)),
    )
    broker = SimpleNamespace(
        config=config, state=state, is_leader=True, store_host=("10.0.0.7", 10911)
    )
    broker.topic = lambda name: Broker.topic(broker, name)  # type: ignore[arg-type]
    return broker


def outcome(prepare: Any, *args: Any) -> object:
    try:
        p = prepare(*args)
    except Exception as err:  # a refusal, a header it cannot read, an IPv6 peer it cannot store
        return type(err)
    return (p.first_properties, p.metas, p.records, p.queue_id, p.halves)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=CHANGES,
    data=st.data(),
    code=CODES,
    peer=st.sampled_from(["127.0.0.2:5000", "10.1.2.3:65535", "[::1]:5000", "nonsense"]),
    body=BODIES,
    message_bytes_max=st.sampled_from([4 << 20, 1000]),
)
def test_the_usual_send_made_in_c_is_what_the_general_path_makes(
    changes: dict[str, int | None],
    data: st.DataObject,
    code: int,
    peer: str,
    body: bytes,
    message_bytes_max: int,
) -> None:
    request = drawn_request(changes, data, code, body)
    connection = SimpleNamespace(peer=peer)
    fast_notes: list[tuple[bytes, tuple[object, ...]]] = []
    slow_notes: list[tuple[bytes, tuple[object, ...]]] = []
    with pytest.MonkeyPatch.context() as patch:  # both stamp the same store time
        patch.setattr(send, "time", SimpleNamespace(time=lambda: FIXED_NOW_MS / 1000))
        broker = fake_broker(fast_notes, message_bytes_max)
        fast = send._prepare_plain(broker, request, connection)
        broker = fake_broker(slow_notes, message_bytes_max)
        slow = outcome(send._prepare_any, broker, request, connection)
    event("made in C" if fast is not None else f"left to the general path: {slow!r:.40}")
    if fast is not None:
        assert (fast.first_properties, fast.metas, fast.records, fast.queue_id, fast.halves) == slow
        assert fast_notes == slow_notes


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=st.lists(st.tuples(CHANGES, CODES, BODIES), min_size=1, max_size=6),
    data=st.data(),
    other=st.sampled_from(
        [None, RequestCode.SEND_BATCH_MESSAGE, RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT]
    ),
)
def test_sends_read_together_are_each_made_as_alone(
    drawn: list[tuple[dict[str, int | None], int, bytes]],
    data: st.DataObject,
    other: int | None,
) -> None:
    """`_prepare_plains` of requests read together: for each, what it makes of that request
    alone (the test above holds that to the general path), in order, with a request of
    another code among them left to Python."""
    requests = [drawn_request(changes, data, code, body) for changes, code, body in drawn]
    if other is not None:
        at = data.draw(st.integers(0, len(requests)), label="other at")
        requests.insert(at, RemotingCommand.request(other, dict(STANDARD), b"x"))
    connection = cast(Connection, SimpleNamespace(peer="127.0.0.2:5000"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(send, "time", SimpleNamespace(time=lambda: FIXED_NOW_MS / 1000))
        together = send._prepare_plains(fake_broker([], 4 << 20), requests, connection)
        alone = [send._prepare_plain(fake_broker([], 4 << 20), r, connection) for r in requests]
    assert together == alone
    if other is not None:
        assert together is not None and together[at] is None


def test_the_usual_send_takes_the_c_path() -> None:
    notes: list[tuple[bytes, tuple[object, ...]]] = []
    for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
        names = header_specs(SendMessageRequestHeader, code == RequestCode.SEND_MESSAGE_V2)
        wire = {field: w for (field, w, _, _), (_, _, _, _) in zip(names, names, strict=True)}
        long_names = header_specs(SendMessageRequestHeader, False)
        to_wire = {lw: wire[f] for f, lw, _, _ in long_names}
        fields = {to_wire[k]: v for k, v in STANDARD.items()}
        request = RemotingCommand.request(code, fields, b"body")
        prepared = send._prepare_plain(
            fake_broker(notes, 4 << 20), request, SimpleNamespace(peer="127.0.0.2:5000")
        )
        assert prepared is not None and len(prepared.records) == 1
        message = stored_message.decode(prepared.records[0])
        assert (message.topic, message.queue_id, message.body) == ("Plain", 1, b"body")
        assert message.born_host == ("127.0.0.2", 5000)
        assert message.properties[props.CLUSTER] == "DefaultCluster"
