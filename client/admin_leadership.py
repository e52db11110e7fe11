"""leadershipTransfer: hand a broker group's Raft leadership (its master role) to one replica.

RocketMQ 4.x's remoting protocol has no request for this, and our broker adds none: each of our
replicas already serves DLedger's client protocol (TRANSFER, STATUS; docs/protocol.md, "Client
requests") on its Raft peer address, as `dledger-client transfer` uses it. So the admin
1. finds the group at the name servers and reads one replica's GET_BROKER_CONFIG, whose
   `dLegerPeers` lists the group's Raft ids and peer addresses;
2. sends TRANSFER to the current leader through dledger.client (which follows NOT_LEADER
   hints), unless the target leads already;
3. polls the target's STATUS until it leads, then every name server until each lists the
   target's client address as the group's master (brokerId 0), so a command run next sees
   the change whichever name server it asks.
This needs the peer addresses to be reachable from where mqadmin runs. A Java RocketMQ broker
on DLedger lists dLegerPeers too, but its peers speak Java DLedger's protocol, not ours: the
transfer fails there with a connection error naming the peer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from client.admin_results import BadAnswer, BrokerConfig, LeadershipTransfer, parse_cluster_info
from client.errors import MQClientError
from dledger.client import ClientError, DLedgerClient, open_client
from dledger.config import ConfigError, parse_peers
from remoting.codes import RequestCode
from remoting.command import RemotingCommand

if TYPE_CHECKING:
    from client.admin import Admin

POLL_S = 0.05  # between two looks at the target's role and at the name servers
STATUS_TIMEOUT_S = 2.0  # one STATUS request


async def _config(admin: Admin, addresses: list[str], group: str) -> BrokerConfig:
    problems = []
    for address in addresses:
        try:
            return await admin.broker_config(address)
        except MQClientError as err:
            problems.append(str(err))
    raise MQClientError(f"no replica of {group} gave its config: " + "; ".join(problems))


async def _wait_leading(client: DLedgerClient, target: str, deadline: float) -> int:
    """The target's term once it leads; MQClientError at the deadline saying who leads."""
    last = "no answer"
    while trio.current_time() < deadline:
        try:
            status = await client.status(target, timeout=STATUS_TIMEOUT_S)
        except (ClientError, trio.TooSlowError) as err:
            last = str(err) or "timed out"
        else:
            if status.get("role") == "leader":
                return int(status.get("term", 0))
            last = f"{target} is {status.get('role')}, {status.get('leader') or 'nobody'} leads"
        await trio.sleep(POLL_S)
    raise MQClientError(f"the transfer to {target} did not finish in time ({last})")


async def _client_address(admin: Admin, addresses: list[str], target: str) -> str:
    """The client address of the replica whose Raft id is `target` ("" if none says so)."""
    for address in addresses:
        try:
            status = await admin.broker_status(address)
        except MQClientError:
            continue
        if status.table.get("raftSelfId") == target:
            return status.table.get("brokerAddr") or address
    return ""


async def _masters(admin: Admin, group: str) -> dict[str, str | None]:
    """Per name server that answers, the address it lists as `group`'s master."""
    out = {}
    request = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
    for namesrv in admin.instance.namesrv:
        try:
            response = await admin.call_ok(namesrv, request, "cluster info", STATUS_TIMEOUT_S)
        except MQClientError:
            continue  # a name server that is down does not hold the route anyone reads
        data = parse_cluster_info(response.body, f"ClusterInfo from {namesrv}").brokers.get(group)
        out[namesrv] = data.master if data is not None else None
    return out


async def _wait_registered(admin: Admin, group: str, address: str, deadline: float) -> None:
    """Until every name server that answers lists `address` as the group's master."""
    masters: dict[str, str | None] = {}
    while trio.current_time() < deadline:
        masters = await _masters(admin, group)
        if masters and all(m == address for m in masters.values()):
            return
        await trio.sleep(POLL_S)
    seen = (
        ", ".join(f"{ns} lists {m or 'no master'}" for ns, m in masters.items()) or "none answers"
    )
    raise MQClientError(
        f"{address} leads {group} but not every name server lists it as master yet ({seen})"
    )


async def transfer(admin: Admin, group: str, target: str, timeout_s: float) -> LeadershipTransfer:
    deadline = trio.current_time() + timeout_s
    data = await admin.group(group)
    addresses = data.addresses()
    config = await _config(admin, addresses, group)
    peers_text = config.properties.get("dLegerPeers", "")
    if not peers_text:
        raise MQClientError(
            f"broker group {group} does not run on DLedger: the config of {config.address} "
            "has no dLegerPeers"
        )
    try:
        peers = parse_peers(peers_text)
    except ConfigError as err:
        raise BadAnswer(f"dLegerPeers of {config.address}", str(err)) from None
    if target not in peers:
        raise MQClientError(
            f"{target!r} is not a replica of {group} (its Raft ids: {', '.join(sorted(peers))})"
        )
    try:
        async with open_client(peers) as client:
            previous = await client.find_leader(timeout=max(0.0, deadline - trio.current_time()))
            if previous != target:
                await client.transfer(target, timeout=max(0.1, deadline - trio.current_time()))
            term = await _wait_leading(client, target, deadline)
    except (ClientError, trio.TooSlowError) as err:
        raise MQClientError(
            f"leadership transfer of {group} to {target}: {err or 'timed out'}"
        ) from None
    address = await _client_address(admin, addresses, target)
    if address:
        await _wait_registered(admin, group, address, deadline)
    return LeadershipTransfer(group, previous or "", target, term, address)
