"""The properties string of a message (docs/formats.md#properties), and the well-known keys.

    key \\x01 value \\x02 key \\x01 value \\x02 ...      UTF-8, each pair ended by \\x02

No escaping: keys and values must not contain \\x01 or \\x02, and encode refuses them. Order
carries no meaning (Java writes HashMap order, the C++ client sorts); encode keeps the dict's
order, so the same dict always gives the same bytes. decode is as lenient as RocketMQ's
`MessageDecoder.string2messageProperties`: a pair without \\x01, with an empty key or an empty
value is skipped, and the last pair may lack its \\x02; for a duplicate key the last one wins.
Whatever a client sent is stored as it came; these functions are for reading it and for the
properties the broker writes itself.
"""

from __future__ import annotations

from remoting import limits
from remoting.errors import BadProperty, PropertiesTooLong

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "  # between the keys inside the KEYS value

# Well-known keys (RocketMQ's MessageConst).
KEYS = "KEYS"  # space-separated business keys; indexed as topic#key
TAGS = "TAGS"  # one tag; its Java hashCode is the ConsumeQueue tag hash
UNIQ_KEY = "UNIQ_KEY"  # the client's message id (MessageClientIDSetter); indexed as topic#id
WAIT = "WAIT"  # "true": answer the send only after the store
DELAY = "DELAY"  # delay level, 1..18
RETRY_TOPIC = "RETRY_TOPIC"  # on a retry: the topic the message was first sent to
REAL_TOPIC = "REAL_TOPIC"  # the topic before a delay or transaction rewrite
REAL_QID = "REAL_QID"  # the queue id before such a rewrite
TRAN_MSG = "TRAN_MSG"  # "true": a transactional half message
PGROUP = "PGROUP"  # the producer group (transactions check back with it)
MIN_OFFSET = "MIN_OFFSET"  # added client-side after a pull
MAX_OFFSET = "MAX_OFFSET"  # added client-side after a pull
BUYER_ID = "BUYER_ID"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"  # on a retry: the id of the message that failed
TRANSFER_FLAG = "TRANSFER_FLAG"
CORRECTION_FLAG = "CORRECTION_FLAG"
MQ2_FLAG = "MQ2_FLAG"
RECONSUME_TIME = "RECONSUME_TIME"
MSG_REGION = "MSG_REGION"
TRACE_ON = "TRACE_ON"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
CONSUME_START_TIME = "CONSUME_START_TIME"
TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
INSTANCE_ID = "INSTANCE_ID"
CORRELATION_ID = "CORRELATION_ID"
REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
TTL = "TTL"
ARRIVE_TIME = "ARRIVE_TIME"
CLUSTER = "CLUSTER"  # the broker adds its cluster name on store
SHARDING_KEY = "__SHARDINGKEY"


def check(key: str, value: str) -> None:
    """Raise BadProperty unless this pair survives an encode/decode round trip."""
    if not key:
        raise BadProperty(key, "empty key")
    if not value:
        raise BadProperty(key, "empty value (RocketMQ's decoder drops such a pair)")
    for text, what in ((key, "key"), (value, "value")):
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            raise BadProperty(key, f"the {what} contains a separator (\\x01 or \\x02)")
        try:
            text.encode()
        except UnicodeEncodeError:
            raise BadProperty(key, f"the {what} is not UTF-8 text (a lone surrogate)") from None


def encode(properties: dict[str, str]) -> bytes:
    """The stored form of `properties`: UTF-8, at most PROPERTIES_BYTES_MAX bytes."""
    text = "".join([f"{key}\x01{value}\x02" for key, value in properties.items()])
    pairs = len(properties)
    try:
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate somewhere
        data = None
    if (  # every pair checked at once: a separator, an empty key or value shows in the text
        data is None  # and a pair that does not encode in the encoding
        or text.count(NAME_VALUE_SEPARATOR) != pairs
        or text.count(PROPERTY_SEPARATOR) != pairs
        or "\x01\x02" in text
        or "\x02\x01" in text
        or text.startswith(NAME_VALUE_SEPARATOR)
    ):
        for key, value in properties.items():
            check(key, value)  # which pair, and why
    assert data is not None, "check refuses every pair that does not encode"
    if len(data) > limits.PROPERTIES_BYTES_MAX:
        raise PropertiesTooLong(len(data), limits.PROPERTIES_BYTES_MAX)
    return data


def decode(data: bytes | bytearray | memoryview) -> dict[str, str]:
    """The pairs of a stored properties string, leniently as RocketMQ reads them.

    Raises UnicodeDecodeError for bytes that are not UTF-8 (the stored-message reader turns it
    into CorruptMessage).
    """
    result: dict[str, str] = {}
    for pair in bytes(data).decode().split(PROPERTY_SEPARATOR):
        key, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep and key and value:
            result[key] = value
    return result


def table(data: bytes) -> dict[bytes, bytes]:
    """Every key's raw value in a stored properties string, in one pass: for the dispatcher,
    which looks up several keys of every message (one `find` each cost more than this and all
    the lookups together). `table(data).get(key) or None` is `find(data, key)`: the last
    occurrence wins, and an empty value is kept here as b"" (find: None)."""
    found: dict[bytes, bytes] = {}
    for pair in data.split(b"\x02"):
        key, sep, value = pair.partition(b"\x01")
        if sep:
            found[key] = value
    return found


def find(data: bytes | bytearray | memoryview, key: bytes) -> bytes | None:
    """The raw value of `key` (given as UTF-8 bytes) in a stored properties string, or None.

    For the dispatcher, which wants TAGS, KEYS and UNIQ_KEY of every message without building
    a dict; same leniency as decode (the last occurrence wins; an empty value counts as absent).
    """
    raw = data if type(data) is bytes else bytes(data)  # no copy of what is bytes already
    needle = key + b"\x01"
    found: bytes | None = None
    start = 0
    while True:
        at = raw.find(needle, start)
        if at < 0:
            return found
        if at == 0 or raw[at - 1] == 2:  # a key starts the string or follows a \x02
            end = raw.find(b"\x02", at)
            value = raw[at + len(needle) : end if end >= 0 else len(raw)]
            found = value or None  # as decode: "k\x01v\x01w" gives k the value "v\x01w"
            start = at + len(needle) + len(value)
        else:
            start = at + 1
