"""Header fields ("custom headers", a command's extFields), each class declared once.

A field is declared with its wire name and kind; `decode` reads a command's extFields (text,
or numbers and booleans as the C++ client sends some) and `encode` writes text only, as the
C++ client needs in answers. A missing required field or an unreadable value raises
HeaderFieldError naming the header and the field. Names and required-ness follow RocketMQ
4.9.4's *RequestHeader / *ResponseHeader classes (@CFNotNull = required).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

import attrs

from remoting.errors import HeaderFieldError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INTEGER = re.compile(r"[+-]?[0-9]+")
TRUE_TEXT = frozenset({"true", "1"})  # C++ sends batch=1
FALSE_TEXT = frozenset({"false", "0"})

KIND_TEXT, KIND_INT, KIND_BOOL = "text", "int", "bool"


def text(wire: str, *, v2: str | None = None, optional: bool = False) -> Any:
    return _field(wire, KIND_TEXT, v2, optional)


def integer(wire: str, *, v2: str | None = None, optional: bool = False) -> Any:
    return _field(wire, KIND_INT, v2, optional)


def boolean(wire: str, *, v2: str | None = None, optional: bool = False) -> Any:
    return _field(wire, KIND_BOOL, v2, optional)


def _field(wire: str, kind: str, v2: str | None, optional: bool) -> Any:
    metadata = {"wire": wire, "kind": kind, "v2": v2}
    if optional:
        return attrs.field(default=None, kw_only=True, metadata=metadata)
    return attrs.field(kw_only=True, metadata=metadata)


class Header:
    """Base of every header class; subclasses are attrs classes made with `text`/`integer`/..."""

    __attrs_attrs__: ClassVar[tuple[attrs.Attribute[Any], ...]]  # set by attrs on subclasses

    @classmethod
    def decode(cls, ext_fields: Mapping[str, object], *, short_names: bool = False) -> Self:
        """Read this header from extFields; `short_names` for SEND_MESSAGE_V2's a, b, c, ...
        Fields are read in declaration order: the first missing or unreadable one is named."""
        decoder = _DECODERS.get((cls, short_names))
        if decoder is None:
            decoder = _DECODERS[(cls, short_names)] = _compile_decoder(cls, short_names)
        header: Self = decoder(ext_fields)
        return header

    def encode(self, *, short_names: bool = False) -> dict[str, str]:
        """extFields for this header, every value as text; None fields are left out."""
        out: dict[str, str] = {}
        for field, wire, _, _ in _specs(type(self), short_names):
            value = getattr(self, field)
            if value is None:
                continue
            if value is True or value is False:
                out[wire] = "true" if value else "false"
            else:
                out[wire] = str(value)
        return out


_DECODERS: dict[tuple[type, bool], Callable[[Mapping[str, object]], Any]] = {}


def _compile_decoder(cls: type, short_names: bool) -> Callable[[Mapping[str, object]], Any]:
    """A decoder for one header class, written out field by field as attrs writes its
    `__init__`s: a send's header has 13 fields, and a loop over their specs cost ~7 us a
    request, twice what the unrolled reads do. Text as a frame decoder makes it (the usual
    case) is taken without the general `_parse`; anything else goes through it."""
    name = cls.__name__
    lines = ["def decode(ext_fields):", "    get = ext_fields.get"]
    arguments = []
    for k, (field, wire, kind, required) in enumerate(_specs(cls, short_names)):
        value = f"f{k}"
        lines.append(f"    raw = get({wire!r})")
        if kind == KIND_TEXT:
            lines.append(f"    if type(raw) is str: {value} = raw")
        elif kind == KIND_INT:
            lines.append(
                "    if type(raw) is str and raw.isascii() and raw.isdigit() and len(raw) < 19:"
                f" {value} = int(raw)"
            )
        else:
            lines.append(f"    if raw == 'true': {value} = True")
            lines.append(f"    elif raw == 'false': {value} = False")
        if required:
            lines.append(f"    elif raw is None: raise HeaderFieldError(NAME, {wire!r}, 'missing')")
        else:
            lines.append(f"    elif raw is None: {value} = None")
        lines.append(f"    else: {value} = parse(NAME, {wire!r}, {kind!r}, raw)")
        arguments.append(f"{field}={value}")
    lines.append(f"    return cls({', '.join(arguments)})")
    namespace: dict[str, Any] = {
        "cls": cls,
        "NAME": name,
        "HeaderFieldError": HeaderFieldError,
        "parse": _parse,
    }
    exec(compile("\n".join(lines), f"<header decoder {name}>", "exec"), namespace)
    decoder: Callable[[Mapping[str, object]], Any] = namespace["decode"]
    return decoder


_SPECS: dict[tuple[type, bool], tuple[tuple[str, str, str, bool], ...]] = {}


def header_specs(cls: type, short_names: bool) -> tuple[tuple[str, str, str, bool], ...]:
    """(field, wire name, kind, required) of each field of a header class, in declaration
    order: what a decoder written elsewhere (broker/dispatch_native.c read_send_fields) reads."""
    return _specs(cls, short_names)


def _specs(cls: type, short_names: bool) -> tuple[tuple[str, str, str, bool], ...]:
    """(field, wire name, kind, required) of a header class, worked out once per class."""
    specs = _SPECS.get((cls, short_names))
    if specs is None:
        specs = tuple(
            (
                f.name,
                f.metadata["v2"] if short_names and f.metadata["v2"] else f.metadata["wire"],
                f.metadata["kind"],
                f.default is attrs.NOTHING,
            )
            for f in attrs.fields(cls)
        )
        _SPECS[(cls, short_names)] = specs
    return specs


def _parse(header: str, wire: str, kind: str, raw: object) -> object:
    if kind == KIND_TEXT:
        if isinstance(raw, bool):
            return "true" if raw else "false"
        if isinstance(raw, str | int):
            return str(raw)
        raise HeaderFieldError(header, wire, f"is a {type(raw).__name__}, not text")
    if kind == KIND_INT:
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise HeaderFieldError(header, wire, f"not an integer: {raw!r:.40}")
        if isinstance(raw, str):
            if not INTEGER.fullmatch(raw):
                raise HeaderFieldError(header, wire, f"not an integer: {raw!r:.40}")
            raw = int(raw)
        if not INT64_MIN <= raw <= INT64_MAX:
            raise HeaderFieldError(header, wire, f"out of the 64-bit range: {raw}")
        return raw
    assert kind == KIND_BOOL, kind
    if isinstance(raw, bool):
        return raw
    lowered = str(raw).lower() if isinstance(raw, str | int) else None
    if lowered in TRUE_TEXT:
        return True
    if lowered in FALSE_TEXT:
        return False
    raise HeaderFieldError(header, wire, f"not a boolean: {raw!r:.40}")


# --- name server ---------------------------------------------------------------------------------


@attrs.frozen
class GetRouteInfoRequestHeader(Header):
    topic: str = text("topic")


# The extFields key of our extension: the Raft term of the registering replica
# (docs/protocol.md#raftterm). Absent for a plain RocketMQ broker.
RAFT_TERM_FIELD = "raftTerm"


@attrs.frozen
class RegisterBrokerRequestHeader(Header):
    broker_name: str = text("brokerName")
    broker_addr: str = text("brokerAddr")
    cluster_name: str = text("clusterName")
    ha_server_addr: str = text("haServerAddr")
    broker_id: int = integer("brokerId")
    compressed: bool | None = boolean("compressed", optional=True)  # body deflated: refused
    body_crc32: int | None = integer("bodyCrc32", optional=True)  # 0 = not checked
    raft_term: int | None = integer(RAFT_TERM_FIELD, optional=True)  # ours


@attrs.frozen
class RegisterBrokerResponseHeader(Header):
    ha_server_addr: str | None = text("haServerAddr", optional=True)
    master_addr: str | None = text("masterAddr", optional=True)


@attrs.frozen
class UnregisterBrokerRequestHeader(Header):
    broker_name: str = text("brokerName")
    broker_addr: str = text("brokerAddr")
    cluster_name: str = text("clusterName")
    broker_id: int = integer("brokerId")


@attrs.frozen
class GetTopicsByClusterRequestHeader(Header):
    cluster: str = text("cluster")


@attrs.frozen
class DeleteTopicInNamesrvRequestHeader(Header):
    topic: str = text("topic")


@attrs.frozen
class QueryDataVersionRequestHeader(Header):
    broker_name: str = text("brokerName")
    broker_addr: str = text("brokerAddr")
    cluster_name: str = text("clusterName")
    broker_id: int = integer("brokerId")


@attrs.frozen
class QueryDataVersionResponseHeader(Header):
    changed: bool = boolean("changed")


# --- broker: sending -----------------------------------------------------------------------------


@attrs.frozen
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE (long names) and SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (`short_names`)."""

    producer_group: str = text("producerGroup", v2="a")
    topic: str = text("topic", v2="b")
    default_topic: str = text("defaultTopic", v2="c")
    default_topic_queue_nums: int = integer("defaultTopicQueueNums", v2="d")
    queue_id: int = integer("queueId", v2="e")  # < 0: the broker picks
    sys_flag: int = integer("sysFlag", v2="f")
    born_timestamp: int = integer("bornTimestamp", v2="g")
    flag: int = integer("flag", v2="h")
    properties: str | None = text("properties", v2="i", optional=True)
    reconsume_times: int | None = integer("reconsumeTimes", v2="j", optional=True)
    unit_mode: bool | None = boolean("unitMode", v2="k", optional=True)
    max_reconsume_times: int | None = integer("maxReconsumeTimes", v2="l", optional=True)
    batch: bool | None = boolean("batch", v2="m", optional=True)  # C++ sends "1"


# The extFields key of our extension on a send's answer: "true" when the replica that answered
# is not the leader and forwarded the write to it (docs/protocol.md#raftforwarded), so the client
# knows its route is stale. Absent from a leader's answer and from a plain RocketMQ broker's.
RAFT_FORWARDED_FIELD = "raftForwarded"

# The extFields key of our extension on a QUERY_CONSUMER_OFFSET answer: "true" when the replica
# could not settle the read (it knew no leader; docs/protocol.md#offsetunsettled), so the
# offset may be older than the group's. Our client then asks the group's other replicas first.
OFFSET_UNSETTLED_FIELD = "offsetUnsettled"
# The extFields key of our extension on a QUERY_CONSUMER_OFFSET request: "true" asks a replica
# that knows no leader to answer unsettled at once instead of waiting for one to settle the
# read (docs/protocol.md#offsetunsettled); our client sends it while other replicas remain to
# be asked. Brokers that do not know it ignore it, as RocketMQ's do every unknown field.
OFFSET_UNSETTLED_AT_ONCE_FIELD = "offsetUnsettledAtOnce"


@attrs.frozen
class SendMessageResponseHeader(Header):
    msg_id: str = text("msgId")  # offsetMsgId; comma-joined for a batch
    queue_id: int = integer("queueId")
    queue_offset: int = integer("queueOffset")  # the first one for a batch
    transaction_id: str | None = text("transactionId", optional=True)
    raft_forwarded: bool | None = boolean(RAFT_FORWARDED_FIELD, optional=True)  # ours


@attrs.frozen
class ConsumerSendMsgBackRequestHeader(Header):
    offset: int = integer("offset")  # the message's physical offset
    group: str = text("group")
    delay_level: int = integer("delayLevel")  # 0: the broker decides
    origin_msg_id: str | None = text("originMsgId", optional=True)
    origin_topic: str | None = text("originTopic", optional=True)
    unit_mode: bool | None = boolean("unitMode", optional=True)
    max_reconsume_times: int | None = integer("maxReconsumeTimes", optional=True)


@attrs.frozen
class EndTransactionRequestHeader(Header):
    producer_group: str = text("producerGroup")
    tran_state_table_offset: int = integer("tranStateTableOffset")
    commit_log_offset: int = integer("commitLogOffset")
    commit_or_rollback: int = integer("commitOrRollback")  # MessageSysFlag 0x8 / 0xC / 0
    from_transaction_check: bool | None = boolean("fromTransactionCheck", optional=True)
    msg_id: str = text("msgId")
    transaction_id: str | None = text("transactionId", optional=True)


@attrs.frozen
class CheckTransactionStateRequestHeader(Header):
    """Broker -> producer."""

    tran_state_table_offset: int = integer("tranStateTableOffset")
    commit_log_offset: int = integer("commitLogOffset")
    msg_id: str | None = text("msgId", optional=True)
    transaction_id: str | None = text("transactionId", optional=True)
    offset_msg_id: str | None = text("offsetMsgId", optional=True)


# --- broker: pulling and offsets -----------------------------------------------------------------


@attrs.frozen
class PullMessageRequestHeader(Header):
    consumer_group: str = text("consumerGroup")
    topic: str = text("topic")
    queue_id: int = integer("queueId")
    queue_offset: int = integer("queueOffset")
    max_msg_nums: int = integer("maxMsgNums")
    sys_flag: int = integer("sysFlag")  # PullSysFlag: 1 commit offset, 2 suspend, 4 subscription
    commit_offset: int = integer("commitOffset")
    suspend_timeout_millis: int = integer("suspendTimeoutMillis")
    subscription: str | None = text("subscription", optional=True)
    sub_version: int = integer("subVersion")
    expression_type: str | None = text("expressionType", optional=True)  # TAG or SQL92


@attrs.frozen
class PullMessageResponseHeader(Header):
    suggest_which_broker_id: int = integer("suggestWhichBrokerId")
    next_begin_offset: int = integer("nextBeginOffset")
    min_offset: int = integer("minOffset")
    max_offset: int = integer("maxOffset")


@attrs.frozen
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str = text("consumerGroup")
    topic: str = text("topic")
    queue_id: int = integer("queueId")


@attrs.frozen
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str = text("consumerGroup")
    topic: str = text("topic")
    queue_id: int = integer("queueId")
    commit_offset: int = integer("commitOffset")


@attrs.frozen
class QueueRequestHeader(Header):
    """GET_MAX_OFFSET, GET_MIN_OFFSET and GET_EARLIEST_MSG_STORETIME: one queue."""

    topic: str = text("topic")
    queue_id: int = integer("queueId")


@attrs.frozen
class SearchOffsetRequestHeader(Header):
    topic: str = text("topic")
    queue_id: int = integer("queueId")
    timestamp: int = integer("timestamp")


@attrs.frozen
class OffsetResponseHeader(Header):
    """QUERY_CONSUMER_OFFSET, GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP."""

    offset: int = integer("offset")


@attrs.frozen
class GetEarliestMsgStoretimeResponseHeader(Header):
    timestamp: int = integer("timestamp")


@attrs.frozen
class ViewMessageRequestHeader(Header):
    offset: int = integer("offset")  # physical offset, from the offsetMsgId


@attrs.frozen
class QueryMessageRequestHeader(Header):
    topic: str = text("topic")
    key: str = text("key")
    max_num: int = integer("maxNum")
    begin_timestamp: int = integer("beginTimestamp")
    end_timestamp: int = integer("endTimestamp")


@attrs.frozen
class QueryMessageResponseHeader(Header):
    index_last_update_timestamp: int = integer("indexLastUpdateTimestamp")
    index_last_update_phyoffset: int = integer("indexLastUpdatePhyoffset")


@attrs.frozen
class TopicRequestHeader(Header):
    """GET_TOPIC_STATS_INFO: one topic."""

    topic: str = text("topic")


@attrs.frozen
class GetConsumerConnectionListRequestHeader(Header):
    consumer_group: str = text("consumerGroup")


@attrs.frozen
class GetConsumeStatsRequestHeader(Header):
    consumer_group: str = text("consumerGroup")
    topic: str | None = text("topic", optional=True)  # absent or "": every subscribed topic


# --- broker: clients -----------------------------------------------------------------------------


@attrs.frozen
class GetConsumerListByGroupRequestHeader(Header):
    consumer_group: str = text("consumerGroup")


@attrs.frozen
class UnregisterClientRequestHeader(Header):
    client_id: str = text("clientID")
    producer_group: str | None = text("producerGroup", optional=True)
    consumer_group: str | None = text("consumerGroup", optional=True)


@attrs.frozen
class NotifyConsumerIdsChangedRequestHeader(Header):
    """Broker -> consumer."""

    consumer_group: str = text("consumerGroup")
