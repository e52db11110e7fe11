"""The broker is a table from request code to handler (RocketMQ's registerProcessor)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from broker import admin, consumer_manage, end_transaction, pull, query, send, send_back, stats
from broker.context import Broker
from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.connection import Connection

Handler = Callable[[Broker, RemotingCommand, Connection], Awaitable[RemotingCommand]]
# one answer per request; an answer may be its frame, already encoded (remoting.connection)
BatchHandler = Callable[
    [Broker, list[RemotingCommand], Connection], Awaitable[Sequence[RemotingCommand | bytes]]
]

HANDLERS: dict[int, Handler] = {
    RequestCode.SEND_MESSAGE: send.handle_send,
    RequestCode.SEND_MESSAGE_V2: send.handle_send,
    RequestCode.SEND_BATCH_MESSAGE: send.handle_send,
    RequestCode.CONSUMER_SEND_MSG_BACK: send_back.handle_send_back,
    RequestCode.END_TRANSACTION: end_transaction.handle_end_transaction,
    RequestCode.PULL_MESSAGE: pull.handle_pull,
    RequestCode.QUERY_CONSUMER_OFFSET: consumer_manage.handle_query_consumer_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: consumer_manage.handle_update_consumer_offset,
    RequestCode.GET_MAX_OFFSET: consumer_manage.handle_max_offset,
    RequestCode.GET_MIN_OFFSET: consumer_manage.handle_min_offset,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: consumer_manage.handle_search_offset,
    RequestCode.GET_EARLIEST_MSG_STORETIME: consumer_manage.handle_earliest_store_time,
    RequestCode.HEART_BEAT: consumer_manage.handle_heartbeat,
    RequestCode.UNREGISTER_CLIENT: consumer_manage.handle_unregister,
    RequestCode.CHECK_CLIENT_CONFIG: consumer_manage.handle_check_client_config,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer_manage.handle_consumer_list,
    RequestCode.LOCK_BATCH_MQ: consumer_manage.handle_lock,
    RequestCode.UNLOCK_BATCH_MQ: consumer_manage.handle_unlock,
    RequestCode.UPDATE_AND_CREATE_TOPIC: admin.handle_update_topic,
    RequestCode.DELETE_TOPIC_IN_BROKER: admin.handle_delete_topic,
    RequestCode.GET_ALL_TOPIC_CONFIG: admin.handle_all_topic_config,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.handle_update_group,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: admin.handle_delete_group,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.handle_all_groups,
    RequestCode.GET_BROKER_RUNTIME_INFO: admin.handle_runtime_info,
    RequestCode.GET_BROKER_CONFIG: admin.handle_broker_config,
    RequestCode.VIEW_MESSAGE_BY_ID: query.handle_view_message,
    RequestCode.QUERY_MESSAGE: query.handle_query_message,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: stats.handle_consumer_connections,
    RequestCode.GET_TOPIC_STATS_INFO: stats.handle_topic_stats,
    RequestCode.GET_CONSUME_STATS: stats.handle_consume_stats,
}

# Sends read from one connection in one go share one append (broker/send.py handle_sends).
BATCHED: dict[int, BatchHandler] = {
    RequestCode.SEND_MESSAGE: send.handle_sends_encoded,
    RequestCode.SEND_MESSAGE_V2: send.handle_sends_encoded,
    RequestCode.SEND_BATCH_MESSAGE: send.handle_sends_encoded,
}


def bound(
    broker: Broker,
) -> dict[int, Callable[[RemotingCommand, Connection], Awaitable[RemotingCommand]]]:
    """The table with `broker` bound, as remoting.dispatch.Dispatcher takes it."""
    return {code: partial(handler, broker) for code, handler in HANDLERS.items()}


def bound_batched(
    broker: Broker,
) -> dict[
    int,
    Callable[[list[RemotingCommand], Connection], Awaitable[Sequence[RemotingCommand | bytes]]],
]:
    """BATCHED with `broker` bound, as Dispatcher's `batched` takes it."""
    return {code: partial(handler, broker) for code, handler in BATCHED.items()}
