"""The queues a producer may send a topic's messages to, from the cached route.

A topic the namesrvs know: its route's write queues. A topic they do not know yet: TBW102's
broker groups with at most DEFAULT_TOPIC_QUEUES queues each, sent with defaultTopic=TBW102 so
the broker creates the topic on the first send (RocketMQ's way; the broker must allow it).
While the topic is unknown every send asks the namesrvs again (ClientInstance.refresh spaces
the queries), so its own route is used as soon as the broker has registered it.

Ordered sends choose among `ordered_queues`: the route's write queues, and for a while also
those of a group that just left the route. A name server that restarts answers routes before
every group has registered with it again; a selector given that shorter list would map a
sharding key onto another group's queue and break its order (the 30-minute broker soak caught
it). A group gone for ORDERED_GROUP_GRACE_S (a name server's broker expiry) is let go.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from client import limits
from client.errors import NoRouteError
from client.instance import ClientInstance
from client.message import MessageQueue
from client.route import TopicRoute


@attrs.define
class _Pinned:
    """The queues ordered sends of a topic chose among last, and since when each group that
    left the route has been missing from it (trio time)."""

    queues: list[MessageQueue]
    missing_since: dict[str, float]


@attrs.frozen
class WriteQueues:
    """The write queues of a topic and the route they came from."""

    route: TopicRoute  # the topic's own, or TBW102's when the topic is not known yet
    queues: list[MessageQueue]

    @property
    def via_default(self) -> bool:
        return self.route.topic == limits.DEFAULT_TOPIC


def default_queues(topic: str, default: TopicRoute) -> list[MessageQueue]:
    """A new topic's queues: TBW102's groups, at most DEFAULT_TOPIC_QUEUES queues each."""
    capped = tuple(
        attrs.evolve(
            q,
            read_queue_nums=min(limits.DEFAULT_TOPIC_QUEUES, q.read_queue_nums),
            write_queue_nums=min(limits.DEFAULT_TOPIC_QUEUES, q.write_queue_nums),
        )
        for q in default.queue_datas
    )
    return TopicRoute(topic, capped, default.broker_datas).write_queues()


class TopicWriteQueues:
    """Write queues per topic, rebuilt only when the instance's cached route changes."""

    def __init__(self, instance: Callable[[], ClientInstance]) -> None:
        self._instance = instance  # the running producer's (raises ClientClosed when closed)
        self._found: dict[str, WriteQueues] = {}
        self._pinned: dict[str, _Pinned] = {}

    def ordered_queues(self, topic: str, found: WriteQueues) -> list[MessageQueue]:
        """The queues an ordered send of `topic` chooses among (see the module's doc)."""
        now = trio.current_time()
        pinned = self._pinned.get(topic)
        present = {q.broker_name for q in found.queues}
        missing: dict[str, float] = {}
        if pinned is not None:
            for name in {q.broker_name for q in pinned.queues} - present:
                since = pinned.missing_since.get(name, now)
                if now - since < limits.ORDERED_GROUP_GRACE_S:
                    missing[name] = since
        if not missing:
            self._pinned[topic] = _Pinned(list(found.queues), {})
            return found.queues
        assert pinned is not None
        kept = [q for q in pinned.queues if q.broker_name in missing]
        queues = sorted([*found.queues, *kept], key=lambda q: (q.broker_name, q.queue_id))
        self._pinned[topic] = _Pinned(queues, missing)
        return queues

    async def find(self, topic: str, deadline: float) -> WriteQueues:
        """The topic's write queues; NoRouteError when there are none to be had by `deadline`."""
        instance = self._instance()
        route = instance.cached_route(topic)
        if route is None:
            route = await self._ask(topic, deadline)
        if route is not None:
            found = self._of(topic, route)
            if not found.queues:
                raise NoRouteError(
                    topic,
                    "its route has no writable queue (no broker group grants write "
                    "permission to it); see mqadmin topicRoute",
                )
            return found
        default = instance.cached_route(limits.DEFAULT_TOPIC) or await self._ask(
            limits.DEFAULT_TOPIC, deadline
        )
        if default is None:
            raise NoRouteError(
                topic,
                f"no namesrv knows it, nor {limits.DEFAULT_TOPIC}, the template brokers create "
                "topics from on first send (is autoCreateTopicEnable off?); create it with "
                "mqadmin updateTopic",
            )
        found = self._of(topic, default)
        if not found.queues:
            raise NoRouteError(
                topic, f"no namesrv knows it, and no broker group lets {limits.DEFAULT_TOPIC} write"
            )
        return found

    def _of(self, topic: str, route: TopicRoute) -> WriteQueues:
        found = self._found.get(topic)
        if found is None or found.route is not route:
            if route.topic == topic:
                queues = route.write_queues()
            else:
                queues = default_queues(topic, route)
            found = self._found[topic] = WriteQueues(route, queues)
        return found

    async def _ask(self, topic: str, deadline: float) -> TopicRoute | None:
        """The namesrvs' route for `topic` now (None: they do not know it), by `deadline`."""
        with trio.move_on_at(deadline):
            return await self._instance().refresh(topic)
        raise NoRouteError(topic, "no namesrv answered within the send timeout")
