"""Every code on the remoting wire, with RocketMQ 4.9.4's numbers.

Request codes are `RequestCode` (common/protocol/RequestCode.java), reply codes `ResponseCode`
(ResponseCode.java plus RemotingSysResponseCode.java). A code we do not serve is still named
here when a client may send it, so logs say what it was; unknown numbers stay plain ints.
"""

from __future__ import annotations

import enum


class RequestCode(enum.IntEnum):
    # --- broker: messages -------------------------------------------------------------------
    SEND_MESSAGE = 10  # C++ clients; long header names
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12  # by key, through the IndexFile
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    TRIGGER_DELETE_FILES = 27
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39  # broker -> producer
    NOTIFY_CONSUMER_IDS_CHANGED = 40  # broker -> consumer
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46  # a consumer's subscription checked before it starts (SQL92)
    # --- name server ------------------------------------------------------------------------
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    # --- admin ------------------------------------------------------------------------------
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220  # broker -> consumer
    GET_CONSUMER_STATUS_FROM_CLIENT = 221  # broker -> consumer
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_CONSUMER_RUNNING_INFO = 307  # broker -> consumer
    CONSUME_MESSAGE_DIRECTLY = 309  # broker -> consumer
    SEND_MESSAGE_V2 = 310  # Java clients; one-letter header names (headers.SEND_V2_NAMES)
    GET_UNIT_TOPIC_LIST = 311
    GET_BROKER_CONSUME_STATS = 317
    SEND_BATCH_MESSAGE = 320  # Java batches; header as SEND_MESSAGE_V2
    QUERY_CONSUME_QUEUE = 321
    QUERY_DATA_VERSION = 322
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327


class ResponseCode(enum.IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1  # generic failure; the remark says which
    SYSTEM_BUSY = 2  # flow control; the client retries elsewhere
    REQUEST_CODE_NOT_SUPPORTED = 3  # the remark names the code
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10  # stored, but not as durable as asked
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14  # the store refuses writes (slave, disk full, not leader)
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202  # sic, RocketMQ's spelling
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208


class LanguageCode(enum.IntEnum):
    """The sender's language: its name in a JSON header, this number in a binary one."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12  # 5.x


class SerializeType(enum.IntEnum):
    """The high byte of the header mark."""

    JSON = 0
    ROCKETMQ = 1  # the binary header of remoting/frame.py


# Flag bits of a command (RemotingCommand.RPC_TYPE and RPC_ONEWAY in Java).
FLAG_RESPONSE = 1 << 0
FLAG_ONEWAY = 1 << 1

# What we put in `version` (MQVersion.Version.V4_9_4.ordinal()).
OUR_VERSION = 401


def code_name(code: int, *, response: bool = False) -> str:
    """`SEND_MESSAGE(10)` for a known code, `code 9999` for another."""
    enum_type: type[enum.IntEnum] = ResponseCode if response else RequestCode
    try:
        return f"{enum_type(code).name}({code})"
    except ValueError:
        return f"code {code}"
