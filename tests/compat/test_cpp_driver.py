"""The C++ client driver itself, against name servers alone: the native library loads in a
subprocess here, and a scenario with no broker reports its errors rather than hanging."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.localcluster import LocalCluster

from .helpers import drive


@pytest.fixture(scope="module")
def namesrv_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("namesrv"), namesrvs=1, groups=())
    try:
        cluster.start_all()
        cluster.wait_serving(timeout=30)
        yield cluster
    finally:
        cluster.stop_all()


def test_a_send_without_brokers_fails_with_the_clients_own_error(
    namesrv_only: LocalCluster, tmp_path: Path
) -> None:
    result = drive(namesrv_only.namesrv_addr, tmp_path, "--topic", "NoSuchTopic", "send-sync", "2")
    assert result["scenario"] == "send-sync" and result["sent"] == []
    assert [e["seq"] for e in result["errors"]] == [0, 1]
    assert all("No route info of this topic" in e["error"] for e in result["errors"])
    assert list((tmp_path / "logs" / "rocketmq-cpp").iterdir()), "the C++ client's log"


def test_consumers_without_brokers_give_up_at_their_timeout(
    namesrv_only: LocalCluster, tmp_path: Path
) -> None:
    for scenario in ("pull", "push-consume"):
        args = ("--topic", "NoSuchTopic", "--timeout", "1", scenario, "1")
        result = drive(namesrv_only.namesrv_addr, tmp_path, *args)
        assert result["scenario"] == scenario
        assert result["received"] == [] and result["complete"] is False
