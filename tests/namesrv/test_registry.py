"""The pure route registry: RocketMQ's rules, the Raft-term rule, expiry."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from namesrv.registry import Registration, Registry, TopicConfig

TBW102 = TopicConfig("TBW102", 8, 8, 7)
TOPIC = TopicConfig("T", 4, 4, 6)
A, B, C = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10931"


def reg(
    addr: str,
    broker_id: int,
    term: int | None = None,
    *,
    name: str = "broker-a",
    cluster: str = "DefaultCluster",
    topics: tuple[TopicConfig, ...] = (TBW102, TOPIC),
    version: int = 1,
) -> Registration:
    return Registration(
        cluster_name=cluster,
        broker_name=name,
        broker_addr=addr,
        broker_id=broker_id,
        ha_server_addr=addr.replace("109", "119"),
        raft_term=term,
        topics=topics,
        data_version={"timestamp": 1000, "counter": version},
    )


def addrs(registry: Registry, topic: str = "T", name: str = "broker-a") -> dict[int, str]:
    route = registry.route(topic)
    assert route is not None
    (broker,) = [b for b in route.broker_datas if b.broker_name == name]
    return dict(broker.broker_addrs)


class TestPlainRocketMQ:
    def test_master_route(self) -> None:
        """A master's topics route to it, TBW102 included, as soon as it registered."""
        r = Registry(10)
        assert r.route("TBW102") is None
        result = r.register(reg(A, 0), 0.0)
        assert result.accepted
        route = r.route("TBW102")
        assert route is not None
        assert [(q.broker_name, q.write_queue_nums, q.perm) for q in route.queue_datas] == [
            ("broker-a", 8, 7)
        ]
        assert addrs(r) == {0: A}
        assert r.route("unknown") is None

    def test_slave_learns_master(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        result = r.register(reg(B, 1, topics=()), 0.0)
        assert (result.master_addr, result.ha_server_addr) == (A, "127.0.0.1:11911")
        assert addrs(r) == {0: A, 1: B}

    def test_last_master_wins_without_terms(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        r.register(reg(B, 0), 0.0)
        assert addrs(r) == {0: B}

    def test_one_id_per_address(self) -> None:
        """A slave that becomes master gives up its slave id (RocketMQ 4.9)."""
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        r.register(reg(B, 1), 0.0)
        r.unregister("broker-a", A, 0)
        r.register(reg(B, 0), 0.0)
        assert addrs(r) == {0: B}

    def test_topics_taken_from_masters_only_when_version_changes(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0, topics=(TOPIC,)), 0.0)
        bigger = TopicConfig("T", 8, 8, 6)
        r.register(reg(A, 0, topics=(bigger,)), 1.0)  # same dataVersion: ignored, as Java
        route = r.route("T")
        assert route is not None and route.queue_datas[0].write_queue_nums == 4
        r.register(reg(A, 0, topics=(bigger,), version=2), 2.0)
        route = r.route("T")
        assert route is not None and route.queue_datas[0].write_queue_nums == 8
        r.register(reg(B, 1, topics=(TopicConfig("S", 1, 1, 6),)), 2.0)
        assert r.route("S") is None  # a slave's topics do not make routes

    def test_unregister_needs_the_right_address(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        assert not r.unregister("broker-a", B, 0)
        assert addrs(r) == {0: A}
        assert r.unregister("broker-a", A, 0)
        assert r.route("T") is None and r.topics() == []

    def test_cluster_views(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        r.register(
            reg(C, 0, name="broker-b", cluster="Other", topics=(TopicConfig("U", 2, 2, 6),)), 0.0
        )
        brokers, clusters = r.cluster_info()
        assert clusters == {"DefaultCluster": ["broker-a"], "Other": ["broker-b"]}
        assert [b.broker_name for b in brokers] == ["broker-a", "broker-b"]
        assert r.topics() == ["T", "TBW102", "U"]
        assert r.topics_of_cluster("Other") == ["U"]
        assert r.topics_of_cluster("nope") == []
        assert r.delete_topic("U") and not r.delete_topic("U")
        assert r.route("U") is None


class TestRaftTerm:
    def test_older_term_never_displaces_master(self) -> None:
        r = Registry(10)
        assert r.register(reg(A, 0, 5), 0.0).accepted
        result = r.register(reg(B, 0, 4), 0.0)
        assert not result.accepted and "stale raft term 4" in result.refusal
        assert (result.master_addr, result.group_term) == (A, 5)
        assert addrs(r) == {0: A}

    def test_newer_term_replaces_master_and_drops_the_old(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0, 5), 0.0)
        r.register(reg(B, 1, 5), 0.0)
        assert r.register(reg(B, 0, 6), 1.0).accepted
        assert addrs(r) == {0: B}  # A is gone until it registers as a slave
        refused = r.register(reg(A, 0, 5), 2.0)  # the deposed leader has not heard yet
        assert not refused.accepted and refused.master_addr == B
        assert addrs(r) == {0: B}
        assert r.register(reg(A, 2, 6), 3.0).accepted  # stepped down
        assert addrs(r) == {0: B, 2: A}

    def test_same_term_first_master_stays(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0, 5), 0.0)
        result = r.register(reg(B, 0, 5), 0.0)
        assert not result.accepted and "already master in raft term 5" in result.refusal
        assert r.register(reg(A, 0, 5), 1.0).accepted  # the master's own heartbeat
        assert addrs(r) == {0: A}

    def test_a_slave_with_a_newer_term_makes_the_old_master_stale(self) -> None:
        """Once a replica registered term 6, a term-5 master claim is refused and loses id 0."""
        r = Registry(10)
        r.register(reg(A, 0, 5), 0.0)
        r.register(reg(C, 2, 6, topics=()), 1.0)
        assert addrs(r) == {0: A, 2: C}  # a slave's term alone does not depose anyone
        assert not r.register(reg(A, 0, 5), 2.0).accepted
        assert addrs(r) == {2: C}
        assert r.register(reg(B, 0, 6), 3.0).accepted
        assert addrs(r) == {0: B, 2: C}

    def test_term_survives_master_expiry(self) -> None:
        """A stale leader cannot take the group back while other replicas are registered."""
        r = Registry(10)
        r.register(reg(A, 0, 5), 0.0)
        r.register(reg(B, 0, 6), 0.0)
        r.register(reg(C, 1, 6, topics=()), 9.0)
        assert r.expire(10.5) == [B]
        assert not r.register(reg(A, 0, 5), 11.0).accepted
        assert r.route("T") is not None and addrs(r) == {1: C}

    def test_empty_group_forgets_its_term(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0, 9), 0.0)
        assert r.expire(20.0) == [A]
        assert r.group_term("broker-a") is None
        assert r.register(reg(A, 0, 1), 21.0).accepted  # a group restarted from empty logs

    def test_plain_master_replaced_by_a_termed_one(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        assert r.register(reg(B, 0, 1), 0.0).accepted
        assert addrs(r) == {0: B}

    @given(
        st.lists(
            st.tuples(st.sampled_from([A, B, C]), st.sampled_from([0, 0, 1, 2]), st.integers(1, 6)),
            max_size=40,
        )
    )
    def test_master_term_never_goes_back(self, regs: list[tuple[str, int, int]]) -> None:
        """Whatever arrives in whatever order: one id per address, master terms only grow."""
        r = Registry(10)
        master_terms: list[int] = []
        for addr, broker_id, term in regs:
            result = r.register(reg(addr, broker_id, term), 0.0)
            if broker_id == 0 and result.accepted:
                master_terms.append(term)
            route = r.route("T")
            if route is not None:
                shown = list(route.broker_datas[0].broker_addrs.values())
                assert len(shown) == len(set(shown))
            brokers, _ = r.cluster_info()
            assert all(b.broker_addrs for b in brokers)
        assert master_terms == sorted(master_terms)


class TestExpiry:
    def test_silent_broker_dropped_after_expiry(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        r.register(reg(B, 1, topics=()), 5.0)
        assert r.expire(10.0) == []
        assert r.expire(10.5) == [A]
        assert addrs(r) == {1: B}  # the group's queues stay while a replica is registered
        assert r.expire(15.5) == [B]
        assert r.route("T") is None and r.topics() == [] and r.cluster_info() == ([], {})

    def test_registration_refreshes(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        r.register(reg(A, 0), 9.0)
        assert r.expire(15.0) == []

    def test_unchanged_data_version_query_refreshes(self) -> None:
        r = Registry(10)
        r.register(reg(A, 0), 0.0)
        assert r.query_data_version(A, {"timestamp": 1000, "counter": 1}, 8.0)[0] is False
        assert r.expire(15.0) == []
        changed, held = r.query_data_version(A, {"timestamp": 1000, "counter": 2}, 17.0)
        assert changed and held == {"timestamp": 1000, "counter": 1}
        assert r.expire(18.5) == [A]
        assert r.query_data_version(A, {}, 19.0) == (True, None)
