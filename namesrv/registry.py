"""The route registry: brokers, their topics, and who is master; pure, time passed in.

Plain RocketMQ rules (RouteInfoManager.java, 4.9.4): a broker group (brokerName) maps broker
ids to addresses, id 0 being the master; one address holds one id in its group; a topic's
queues come from its groups' masters' topic tables; a group with no address left takes its
topics' queues with it.

Our rule on top, for replicas of a Raft group (registrations carrying `raftTerm`): each group
remembers the highest term any of its replicas registered with. A claim to be master (id 0)
with a lower term is refused, and if the claimant held id 0 it loses it: it is a deposed
leader that has not heard yet. A claim with the highest term replaces the master, and the old
master's address is dropped from the group until it registers again (as a slave, once it has
stepped down). Two claims with one term from two addresses cannot both be leaders in Raft;
the first keeps id 0. A group whose every address went silent (expired) or unregistered
forgets its term, so a group restarted from empty logs registers again; a refusal never makes
it forget. Registrations without a term (plain RocketMQ
brokers) keep RocketMQ's behaviour: the last to register as id 0 is master.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

log = logging.getLogger("namesrv.registry")

MASTER_ID = 0
PERM_READ, PERM_WRITE, PERM_INHERIT = 4, 2, 1


@attrs.frozen
class QueueData:
    """One broker group's queues of one topic, as routes show them."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@attrs.frozen
class TopicConfig:
    """One entry of a registration's topicConfigTable."""

    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@attrs.frozen
class Registration:
    """REGISTER_BROKER, header and body together."""

    cluster_name: str
    broker_name: str
    broker_addr: str
    broker_id: int
    ha_server_addr: str = ""
    raft_term: int | None = None  # ours; None from a plain RocketMQ broker
    topics: tuple[TopicConfig, ...] = ()
    data_version: Mapping[str, Any] = attrs.field(factory=dict)  # {"timestamp", "counter"}


@attrs.frozen
class RegisterResult:
    accepted: bool
    master_addr: str | None  # the group's master after this registration (for a slave)
    ha_server_addr: str | None  # the master's HA address
    refusal: str = ""  # why not accepted
    group_term: int | None = None  # the highest term the group registered with


@attrs.frozen
class TopicRoute:
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]


@attrs.frozen
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: Mapping[int, str]  # broker id -> address; 0 is the master


@attrs.define
class _Live:
    """What we know of one registered address."""

    broker_name: str
    last_seen_s: float
    ha_server_addr: str
    data_version: Mapping[str, Any]
    raft_term: int | None


@attrs.define
class _Group:
    cluster: str
    addrs: dict[int, str] = attrs.field(factory=dict)
    master_term: int | None = None  # the term in which addrs[0] claimed it


class Registry:
    def __init__(self, broker_expiry_s: float) -> None:
        assert broker_expiry_s > 0
        self.broker_expiry_s = broker_expiry_s
        self._topics: dict[str, dict[str, QueueData]] = {}  # topic -> broker name -> queues
        self._groups: dict[str, _Group] = {}  # broker name -> group
        self._clusters: dict[str, set[str]] = {}  # cluster -> broker names
        self._live: dict[str, _Live] = {}  # broker address -> liveness
        # broker name -> the highest raftTerm any of its replicas registered with; kept while
        # the group has an address, or lost its last one by refusal (not by silence)
        self._terms: dict[str, int] = {}

    # --- registrations ------------------------------------------------------------------------

    def register(self, reg: Registration, now_s: float) -> RegisterResult:
        group = self._groups.get(reg.broker_name)
        if group is None:
            group = self._groups[reg.broker_name] = _Group(reg.cluster_name)
            self._clusters.setdefault(reg.cluster_name, set()).add(reg.broker_name)
        if reg.raft_term is not None and reg.raft_term > self._terms.get(reg.broker_name, -1):
            self._terms[reg.broker_name] = reg.raft_term
        if reg.broker_id == MASTER_ID:
            refusal = self._master_claim_refusal(group, reg)
            if refusal:
                if group.addrs.get(MASTER_ID) == reg.broker_addr:
                    log.info("%s loses master of %s: %s", reg.broker_addr, reg.broker_name, refusal)
                    self._drop_addr(reg.broker_addr, forget_term=False)
                if not group.addrs and reg.broker_name in self._groups:  # made for this claim
                    self._drop_group(reg.broker_name)
                return self._result(reg.broker_name, accepted=False, refusal=refusal)
            old = group.addrs.get(MASTER_ID)
            if old is not None and old != reg.broker_addr:
                log.info(
                    "%s master %s -> %s (term %s)",
                    reg.broker_name,
                    old,
                    reg.broker_addr,
                    reg.raft_term,
                )
                if reg.raft_term is not None:
                    # the deposed leader comes back as a slave; the group stays for the new master
                    self._drop_addr(old, keep_group=reg.broker_name)
            group.master_term = reg.raft_term
        new_at_id = group.addrs.get(reg.broker_id) != reg.broker_addr
        self._place(group, reg)
        first = self._live.get(reg.broker_addr) is None
        previous_version = None if first else self._live[reg.broker_addr].data_version
        self._live[reg.broker_addr] = _Live(
            broker_name=reg.broker_name,
            last_seen_s=now_s,
            ha_server_addr=reg.ha_server_addr,
            data_version=dict(reg.data_version),
            raft_term=reg.raft_term,
        )
        if first:
            log.info("new broker %s of %s, id %d", reg.broker_addr, reg.broker_name, reg.broker_id)
        if reg.broker_id == MASTER_ID and (new_at_id or previous_version != reg.data_version):
            for topic in reg.topics:
                self._set_queues(reg.broker_name, topic)
        return self._result(reg.broker_name, accepted=True)

    def _master_claim_refusal(self, group: _Group, reg: Registration) -> str:
        term = reg.raft_term
        if term is None:
            return ""  # plain RocketMQ: the last master to register wins
        group_term = self._terms.get(reg.broker_name)
        if group_term is not None and term < group_term:
            return f"stale raft term {term}: the group has registered term {group_term}"
        master = group.addrs.get(MASTER_ID)
        if master is not None and master != reg.broker_addr and group.master_term == term:
            return f"{master} is already master in raft term {term}"
        return ""

    def _place(self, group: _Group, reg: Registration) -> None:
        # One address holds one id: a slave becoming master gives up its slave id, and back.
        for broker_id, addr in list(group.addrs.items()):
            if addr == reg.broker_addr and broker_id != reg.broker_id:
                del group.addrs[broker_id]
        group.addrs[reg.broker_id] = reg.broker_addr
        if group.cluster != reg.cluster_name:  # a group moved to another cluster
            self._clusters.get(group.cluster, set()).discard(reg.broker_name)
            group.cluster = reg.cluster_name
            self._clusters.setdefault(reg.cluster_name, set()).add(reg.broker_name)

    def _set_queues(self, broker_name: str, topic: TopicConfig) -> None:
        queues = QueueData(
            broker_name=broker_name,
            read_queue_nums=topic.read_queue_nums,
            write_queue_nums=topic.write_queue_nums,
            perm=topic.perm,
            topic_sys_flag=topic.topic_sys_flag,
        )
        by_broker = self._topics.setdefault(topic.topic_name, {})
        if by_broker.get(broker_name) != queues:
            if broker_name in by_broker:
                log.info("topic %s changed on %s: %s", topic.topic_name, broker_name, queues)
            by_broker[broker_name] = queues

    def _result(self, broker_name: str, *, accepted: bool, refusal: str = "") -> RegisterResult:
        group = self._groups.get(broker_name)
        master = group.addrs.get(MASTER_ID) if group else None
        live = self._live.get(master) if master else None
        return RegisterResult(
            accepted=accepted,
            master_addr=master,
            ha_server_addr=live.ha_server_addr if live else None,
            refusal=refusal,
            group_term=self._terms.get(broker_name),
        )

    def unregister(self, broker_name: str, broker_addr: str, broker_id: int) -> bool:
        """UNREGISTER_BROKER: True if that address held that id."""
        group = self._groups.get(broker_name)
        if group is None or group.addrs.get(broker_id) != broker_addr:
            return False  # e.g. a deposed master unregistering after its successor came
        self._drop_addr(broker_addr)
        return True

    def _drop_addr(self, addr: str, *, keep_group: str = "", forget_term: bool = True) -> None:
        live = self._live.pop(addr, None)
        names = [live.broker_name] if live else list(self._groups)
        for name in names:
            group = self._groups.get(name)
            if group is None:
                continue
            for broker_id in [i for i, a in group.addrs.items() if a == addr]:
                del group.addrs[broker_id]
                if broker_id == MASTER_ID:
                    group.master_term = None
            if not group.addrs and name != keep_group:
                self._drop_group(name)
                if forget_term:
                    self._terms.pop(name, None)

    def _drop_group(self, broker_name: str) -> None:
        group = self._groups.pop(broker_name)
        log.info("broker group %s has no address left: its routes go", broker_name)
        names = self._clusters.get(group.cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self._clusters[group.cluster]
        for topic in list(self._topics):
            self._topics[topic].pop(broker_name, None)
            if not self._topics[topic]:
                del self._topics[topic]

    # --- time ---------------------------------------------------------------------------------

    def expire(self, now_s: float) -> list[str]:
        """Drop every address silent for more than broker_expiry_s; the dropped addresses."""
        silent = [
            addr
            for addr, live in self._live.items()
            if now_s - live.last_seen_s > self.broker_expiry_s
        ]
        for addr in silent:
            log.warning("broker %s silent for more than %g s: dropped", addr, self.broker_expiry_s)
            self._drop_addr(addr)
        return silent

    def query_data_version(
        self, broker_addr: str, data_version: Mapping[str, Any], now_s: float
    ) -> tuple[bool, Mapping[str, Any] | None]:
        """QUERY_DATA_VERSION: (changed, what we hold); an unchanged answer counts as heard."""
        live = self._live.get(broker_addr)
        if live is None:
            return True, None
        changed = dict(live.data_version) != dict(data_version)
        if not changed:
            live.last_seen_s = now_s
        return changed, live.data_version

    # --- reading ------------------------------------------------------------------------------

    def route(self, topic: str) -> TopicRoute | None:
        """GET_ROUTEINFO_BY_TOPIC; None when no group of the topic is registered."""
        by_broker = self._topics.get(topic)
        if not by_broker:
            return None
        names = sorted(by_broker)
        brokers = tuple(self.broker_data(name) for name in names if name in self._groups)
        if not brokers:
            return None
        return TopicRoute(tuple(by_broker[name] for name in names), brokers)

    def broker_data(self, broker_name: str) -> BrokerData:
        group = self._groups[broker_name]
        return BrokerData(group.cluster, broker_name, dict(sorted(group.addrs.items())))

    def cluster_info(self) -> tuple[list[BrokerData], dict[str, list[str]]]:
        """GET_BROKER_CLUSTER_INFO: every group, and cluster -> broker names."""
        brokers = [self.broker_data(name) for name in sorted(self._groups)]
        return brokers, {c: sorted(names) for c, names in sorted(self._clusters.items())}

    def topics(self) -> list[str]:
        return sorted(self._topics)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        names = self._clusters.get(cluster, set())
        return sorted(t for t, by_broker in self._topics.items() if names & by_broker.keys())

    def delete_topic(self, topic: str) -> bool:
        return self._topics.pop(topic, None) is not None

    def group_term(self, broker_name: str) -> int | None:
        return self._terms.get(broker_name)
