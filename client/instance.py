"""What every producer and consumer runs on: namesrv routes, broker connections, heartbeats.

`open_instance(namesrv)` starts one; it lives until its `async with` block ends. It
- asks every namesrv in turn for a topic's route (the last one that answered first), caches
  it, refreshes every cached route every 30 s (`ROUTE_POLL_S`) and at once on `refresh(topic)`,
  which producers and consumers call after a dropped connection, a refused write or a timeout;
- keeps one connection per broker address (client/connections.py);
- sends HEART_BEAT to every replica of every broker group in its routes every 30 s and
  on `heartbeat_now()`, with what the registered `heartbeat_parts` return; a broker
  forgets a client after 120 s without one;
- answers the broker's requests through `serve(code, handler)`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from client.connections import ConnectionPool
from client.errors import MQBrokerError, NoRouteError
from client.route import BrokerData, TopicRoute, parse_route
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.errors import ConnectionClosed, RequestTimeout
from remoting.message_id import UniqIdGenerator

log = logging.getLogger("client.instance")

ROUTE_POLL_S = 30.0  # pollNameServerInterval: the refresh of every cached route
HEARTBEAT_S = 30.0  # heartbeatBrokerInterval
NAMESRV_TIMEOUT_S = 3.0  # one namesrv's answer to a route query
REFRESH_SPACING_S = 0.05  # an immediate refresh of one topic at most this often
DEFAULT_TOPIC = "TBW102"  # the template a new topic is created from on first send

# Errors of one request that say nothing about the request itself: the peer is gone or slow.
TRANSPORT_FAILURES = (ConnectionClosed, RequestTimeout, OSError, trio.TooSlowError)

ServerRequestHandler = Callable[[RemotingCommand, Connection], Awaitable[RemotingCommand]]
HeartbeatPart = Callable[[], dict[str, list[dict[str, Any]]]]


def parse_namesrv(namesrv: str | Sequence[str]) -> list[str]:
    """ "a:9876;b:9876" (RocketMQ's form) or a list, into addresses."""
    items = namesrv.split(";") if isinstance(namesrv, str) else list(namesrv)
    out = [item.strip() for item in items if item.strip()]
    if not out:
        raise ValueError("no namesrv address given")
    return out


def local_ip() -> str:
    """The address put into client ids and message ids: the host's, else loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: it only picks a route
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class ClientInstance:
    def __init__(
        self, nursery: trio.Nursery, namesrv: str | Sequence[str], instance_name: str
    ) -> None:
        self.namesrv = parse_namesrv(namesrv)
        self.ip = local_ip()
        self.client_id = f"{self.ip}@{instance_name}"
        self.uniq_ids = UniqIdGenerator.for_this_process(self.ip)
        self._nursery = nursery
        self._handlers: dict[int, ServerRequestHandler] = {}
        self.pool = ConnectionPool(nursery, self._serve)
        self._routes: dict[str, TopicRoute] = {}
        # the last BrokerData seen of each group, for a group that left every cached route a
        # moment ago (a restarted namesrv answers before every group registered again)
        self._last_broker_data: dict[str, BrokerData] = {}
        self._route_changed: dict[str, trio.Event] = {}
        self._refreshing: dict[str, trio.Lock] = {}
        self._last_refresh: dict[str, float] = {}
        self._namesrv_first = 0  # index of the namesrv that answered last
        self.heartbeat_parts: list[HeartbeatPart] = []
        self._heartbeat_wanted = trio.Event()

    # --- routes ----------------------------------------------------------------------------

    def cached_route(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    async def route(self, topic: str) -> TopicRoute:
        """The cached route, fetched first if there is none; NoRouteError if no namesrv has it."""
        route = self._routes.get(topic)
        if route is not None:
            return route
        route = await self.refresh(topic)
        if route is None:
            raise NoRouteError(topic, "no namesrv knows it (create it with mqadmin updateTopic)")
        return route

    async def refresh(self, topic: str, *, force: bool = False) -> TopicRoute | None:
        """Ask the namesrvs now; None if the topic does not exist. Concurrent refreshes of one
        topic share one query, and one topic is queried at most every REFRESH_SPACING_S unless
        `force`. Raises NoRouteError when no namesrv answers at all."""
        lock = self._refreshing.setdefault(topic, trio.Lock())
        asked_at = trio.current_time()
        async with lock:
            last = self._last_refresh.get(topic, -1e9)
            if last >= asked_at or (not force and asked_at - last < REFRESH_SPACING_S):
                return self._routes.get(topic)  # someone refreshed while we waited
            route = await self._query_route(topic)
            self._last_refresh[topic] = trio.current_time()
        if route is None:
            self._routes.pop(topic, None)
            return None
        if self._routes.get(topic) != route:
            self._routes[topic] = route
            for data in route.broker_datas:
                self._last_broker_data[data.broker_name] = data
            self._route_changed.pop(topic, trio.Event()).set()
            self._heartbeat_wanted.set()  # a new broker address hears from us at once
        return route

    async def wait_route_change(self, topic: str) -> None:
        """Until the cached route of `topic` changes (callers bound it with a timeout)."""
        await self._route_changed.setdefault(topic, trio.Event()).wait()

    async def _query_route(self, topic: str) -> TopicRoute | None:
        failures = []
        count = len(self.namesrv)
        for step in range(count):
            index = (self._namesrv_first + step) % count
            address = self.namesrv[index]
            request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            try:
                response = await self.pool.request(address, request, NAMESRV_TIMEOUT_S)
            except TRANSPORT_FAILURES as err:
                failures.append(f"{address}: {err}")
                self.pool.drop(address)
                continue
            self._namesrv_first = index
            if response.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            if response.code != ResponseCode.SUCCESS:
                failures.append(f"{address}: {MQBrokerError(response.code, response.remark)}")
                continue
            try:
                return parse_route(topic, response.body)
            except (ValueError, KeyError, TypeError) as err:
                failures.append(f"{address}: unreadable route ({err})")
        raise NoRouteError(topic, "no namesrv answered: " + "; ".join(failures))

    def broker_data(self, broker_name: str) -> BrokerData | None:
        """The freshest BrokerData of a group across cached routes (they may differ briefly)."""
        found = None
        for route in self._routes.values():
            data = route.broker(broker_name)
            if data is not None and (found is None or data.master is not None):
                found = data
                if data.master is not None:
                    break
        return found

    def last_broker_data(self, broker_name: str) -> BrokerData | None:
        """As broker_data, or else the group's data from the last route that named it: its
        replicas' addresses are still the best guess (any replica forwards a write)."""
        return self.broker_data(broker_name) or self._last_broker_data.get(broker_name)

    def broker_addresses(self, broker_name: str) -> list[str]:
        """Every known address of a group, the master first; any replica takes a write. A
        group no cached route names now keeps the addresses it was last seen with."""
        data = self.last_broker_data(broker_name)
        return data.addresses() if data is not None else []

    def broker_name_of(self, address: str) -> str | None:
        """The group a broker address belongs to, as the cached routes say, or None."""
        for route in self._routes.values():
            for data in route.broker_datas:
                if address in data.addresses():
                    return data.broker_name
        return None

    def all_broker_addresses(self) -> set[str]:
        return {
            a for route in self._routes.values() for b in route.broker_datas for a in b.addresses()
        }

    # --- requests --------------------------------------------------------------------------

    async def request(
        self, address: str, command: RemotingCommand, timeout_s: float
    ) -> RemotingCommand:
        """One request to one address; a transport failure drops the connection and re-raises."""
        try:
            return await self.pool.request(address, command, timeout_s)
        except TRANSPORT_FAILURES:
            self.pool.drop(address)
            raise

    def serve(self, code: int, handler: ServerRequestHandler) -> None:
        """Answer the broker's requests of `code` (NOTIFY_CONSUMER_IDS_CHANGED, ...)."""
        self._handlers[int(code)] = handler

    async def _serve(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        handler = self._handlers.get(request.code)
        if handler is None:
            return request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request code {request.code} is not served by this client",
            )
        return await handler(request, conn)

    # --- heartbeats ------------------------------------------------------------------------

    def heartbeat_now(self) -> None:
        self._heartbeat_wanted.set()

    async def send_heartbeats(self) -> None:
        """One HEART_BEAT to every known broker address, all at once; failures are logged."""
        body: dict[str, Any] = {
            "clientID": self.client_id,
            "producerDataSet": [],
            "consumerDataSet": [],
        }
        for part in self.heartbeat_parts:
            for key, items in part().items():
                body[key].extend(items)
        if not body["producerDataSet"] and not body["consumerDataSet"]:
            return
        payload = json.dumps(body).encode()

        async def one(address: str) -> None:
            request = RemotingCommand.request(RequestCode.HEART_BEAT, {}, payload)
            try:
                response = await self.request(address, request, NAMESRV_TIMEOUT_S)
            except TRANSPORT_FAILURES as err:
                log.debug("heartbeat to %s failed: %s", address, err)
                return
            if response.code != ResponseCode.SUCCESS:
                log.warning("heartbeat to %s refused: %s", address, response.remark)

        async with trio.open_nursery() as nursery:
            for address in sorted(self.all_broker_addresses()):
                nursery.start_soon(one, address)

    async def _heartbeat_loop(self) -> None:
        while True:
            with trio.move_on_after(HEARTBEAT_S):
                await self._heartbeat_wanted.wait()
            self._heartbeat_wanted = trio.Event()
            await self.send_heartbeats()

    async def _route_loop(self) -> None:
        while True:
            await trio.sleep(ROUTE_POLL_S)
            for topic in list(self._routes):
                try:
                    await self.refresh(topic)
                except NoRouteError as err:
                    log.warning("%s", err)

    def start_background(self) -> None:
        self._nursery.start_soon(self._heartbeat_loop)
        self._nursery.start_soon(self._route_loop)


_instance_numbers = iter(range(1, 1 << 62))


@asynccontextmanager
async def open_instance(
    namesrv: str | Sequence[str], instance_name: str | None = None
) -> AsyncIterator[ClientInstance]:
    """A ClientInstance whose background tasks and connections end with the block."""
    name = instance_name or f"{os.getpid()}#{next(_instance_numbers)}"
    async with trio.open_nursery() as nursery:
        instance = ClientInstance(nursery, namesrv, name)
        instance.start_background()
        try:
            yield instance
        finally:
            instance.pool.close_all()
            nursery.cancel_scope.cancel()
