"""One real local cluster for the client's integration tests: 1 name server and 2 broker
groups x 3 `dledger-broker` replicas on 127.0.0.1, started when a test first asks for it and
stopped at the end of the session. A test that kills a replica restarts it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.localcluster import LocalCluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("client-cluster"),
        namesrvs=1,
        groups=("broker-a", "broker-b"),
        replicas=3,
        extra_broker_args=["--log-level", "INFO"],
    )
    try:
        c.start_all()
        c.wait_serving(timeout=60)
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def live_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster; a process that exits during the test (and is not started again) fails
    it, naming its log."""
    before = {n for n, code in cluster.exited().items()}
    yield cluster
    died = {n for n in cluster.exited()} - before
    assert not died, [str(cluster.processes[n].log_path) for n in sorted(died)]
