"""The name server's request handlers: remoting requests in, registry calls, answers out.

Codes served (docs/protocol.md#name-server): REGISTER_BROKER, UNREGISTER_BROKER,
GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
GET_TOPICS_BY_CLUSTER, DELETE_TOPIC_IN_NAMESRV, QUERY_DATA_VERSION. Anything else is answered
REQUEST_CODE_NOT_SUPPORTED by the Dispatcher.
"""

from __future__ import annotations

import logging
import zlib

import trio

from namesrv.bodies import (
    BadBody,
    decode_data_version,
    decode_register_body,
    encode_cluster_info,
    encode_data_version,
    encode_route,
    encode_topic_list,
)
from namesrv.registry import Registration, Registry
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.dispatch import Dispatcher
from remoting.headers import (
    RAFT_TERM_FIELD,
    DeleteTopicInNamesrvRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)

log = logging.getLogger("namesrv.service")

# RocketMQ's remark, FAQUrl.suggestTodo(APPLY_TOPIC_URL) included.
NO_ROUTE_REMARK = (
    "No topic route info in name server for the topic: {topic}\n"
    "See http://rocketmq.apache.org/docs/faq/ for further details."
)


class NameService:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def dispatcher(self) -> Dispatcher:
        return Dispatcher(
            {
                RequestCode.REGISTER_BROKER: self.register_broker,
                RequestCode.UNREGISTER_BROKER: self.unregister_broker,
                RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route,
                RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
                RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topics,
                RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
                RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
                RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            }
        )

    async def register_broker(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = RegisterBrokerRequestHeader.decode(request.ext_fields)
        if header.compressed:
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                "compressed registrations are not supported; set compressedRegister=false",
            )
        if header.body_crc32 and header.body_crc32 != zlib.crc32(request.body) & 0x7FFFFFFF:
            return request.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        try:
            topics, data_version = decode_register_body(request.body)
        except BadBody as err:
            return request.response(ResponseCode.SYSTEM_ERROR, str(err))
        registration = Registration(
            cluster_name=header.cluster_name,
            broker_name=header.broker_name,
            broker_addr=header.broker_addr,
            broker_id=header.broker_id,
            ha_server_addr=header.ha_server_addr,
            raft_term=header.raft_term,
            topics=topics,
            data_version=data_version,
        )
        result = self.registry.register(registration, trio.current_time())
        ext = RegisterBrokerResponseHeader(
            ha_server_addr=result.ha_server_addr, master_addr=result.master_addr
        ).encode()
        if result.group_term is not None:
            ext[RAFT_TERM_FIELD] = str(result.group_term)
        if not result.accepted:
            log.info(
                "refused %s as master of %s: %s",
                header.broker_addr,
                header.broker_name,
                result.refusal,
            )
            return request.response(ResponseCode.SYSTEM_ERROR, result.refusal, ext)
        return request.response(ResponseCode.SUCCESS, "", ext)

    async def unregister_broker(
        self, request: RemotingCommand, conn: Connection
    ) -> RemotingCommand:
        header = UnregisterBrokerRequestHeader.decode(request.ext_fields)
        removed = self.registry.unregister(header.broker_name, header.broker_addr, header.broker_id)
        log.info(
            "unregister %s (%s id %d): %s",
            header.broker_addr,
            header.broker_name,
            header.broker_id,
            "removed" if removed else "not registered there",
        )
        return request.response()

    async def get_route(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = GetRouteInfoRequestHeader.decode(request.ext_fields).topic
        route = self.registry.route(topic)
        if route is None:
            return request.response(
                ResponseCode.TOPIC_NOT_EXIST, NO_ROUTE_REMARK.format(topic=topic)
            )
        return request.response(body=encode_route(route))

    async def get_cluster_info(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return request.response(body=encode_cluster_info(*self.registry.cluster_info()))

    async def get_all_topics(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return request.response(body=encode_topic_list(self.registry.topics()))

    async def get_topics_by_cluster(
        self, request: RemotingCommand, conn: Connection
    ) -> RemotingCommand:
        cluster = GetTopicsByClusterRequestHeader.decode(request.ext_fields).cluster
        return request.response(body=encode_topic_list(self.registry.topics_of_cluster(cluster)))

    async def delete_topic(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = DeleteTopicInNamesrvRequestHeader.decode(request.ext_fields).topic
        if self.registry.delete_topic(topic):
            log.info("topic %s deleted", topic)
        return request.response()

    async def query_data_version(
        self, request: RemotingCommand, conn: Connection
    ) -> RemotingCommand:
        header = QueryDataVersionRequestHeader.decode(request.ext_fields)
        try:
            version = decode_data_version(request.body)
        except BadBody as err:
            return request.response(ResponseCode.SYSTEM_ERROR, str(err))
        changed, held = self.registry.query_data_version(
            header.broker_addr, version, trio.current_time()
        )
        return request.response(
            ext_fields=QueryDataVersionResponseHeader(changed=changed).encode(),
            body=encode_data_version(held) if held is not None else b"",
        )
