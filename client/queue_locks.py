"""Broker locks of an orderly consumer's queues (clustering mode; protocol reference 3.9).

A queue is consumed only while this client holds its lock on the queue's broker
(LOCK_BATCH_MQ; the broker grants a queue to one client of a group, for a 60 s lease, and our
broker keeps locks in the replicated log so they survive a leader change). `ensure` asks for
one queue's lock when it is not held or older than LOCK_VALID_S (30 s, client/process_queue.py);
`renew_all` asks for every owned queue's, one request per broker, every `lock_renew_s`
(20 s); `release` gives one back (UNLOCK_BATCH_MQ) once its last batch is done and its offset
committed. Requests go to the broker's master, and to its other replicas when that fails.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import trio

from client.consumer_requests import ConsumerRequests
from client.errors import MQClientError
from client.message import MessageQueue
from client.process_queue import ProcessQueue

log = logging.getLogger("client.queue_locks")


class QueueLocks:
    def __init__(self, requests: ConsumerRequests, group: str, client_id: str) -> None:
        self._requests = requests
        self._group = group
        self._client_id = client_id

    async def ensure(self, pq: ProcessQueue) -> bool:
        """Whether the queue's lock is held now (asked for when not held or getting old)."""
        sent_at = trio.current_time()
        if pq.lock_valid(sent_at):
            return True
        queue = pq.queue
        try:
            granted = await self._requests.lock(
                self._group, self._client_id, queue.broker_name, [queue]
            )
        except MQClientError as err:
            log.debug("lock of %s: %s", queue, err)
            return False
        pq.set_locked(queue in granted, sent_at)
        return pq.locked

    async def renew_all(self, owned: Mapping[MessageQueue, ProcessQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for queue in owned:
            by_broker.setdefault(queue.broker_name, []).append(queue)
        for broker, queues in sorted(by_broker.items()):
            sent_at = trio.current_time()
            try:
                granted = await self._requests.lock(self._group, self._client_id, broker, queues)
            except MQClientError as err:
                log.warning("renewing the locks on %s: %s", broker, err)
                continue
            for queue in queues:
                pq = owned.get(queue)
                if pq is not None:
                    if pq.locked and queue not in granted:
                        log.warning("lost the lock of %s: its consumption stops", queue)
                    pq.set_locked(queue in granted, sent_at)

    async def release(self, queue: MessageQueue) -> None:
        try:
            await self._requests.unlock(self._group, self._client_id, queue.broker_name, [queue])
        except MQClientError as err:
            log.warning("unlock of %s: %s (the broker's lease runs out)", queue, err)
