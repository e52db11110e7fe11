"""Every bound of the producer, in one place, unit last, with its reason.

The relations at the bottom keep the numbers consistent with each other and with remoting/.
"""

from __future__ import annotations

from remoting import limits as remoting_limits

KiB, MiB = 1 << 10, 1 << 20

# --- messages (RocketMQ's Validators) -------------------------------------------------------------
MESSAGE_BODY_BYTES_MAX = 4 * MiB  # DefaultMQProducer.maxMessageSize, checked before compression
TOPIC_CHARS_MAX = 127  # Validators.TOPIC_MAX_LENGTH: the stored record's topic length is one byte
GROUP_CHARS_MAX = 255  # Validators.CHARACTER_MAX_LENGTH for a producer group
DELAY_LEVEL_MAX = 18  # RocketMQ's messageDelayLevel has 18 levels; 0 is no delay

# --- sending ---------------------------------------------------------------------------------------
SEND_TIMEOUT_S_DEFAULT = 3.0  # DefaultMQProducer.sendMsgTimeout: one send, every retry included
RETRY_TIMES_DEFAULT = 2  # retryTimesWhenSendFailed: up to 3 attempts per send
RETRY_TIMES_MAX = 16  # more attempts than this only repeat what the route already said
DEFAULT_TOPIC = "TBW102"  # the template a broker auto-creates an unknown topic from
DEFAULT_TOPIC_QUEUES = 4  # defaultTopicQueueNums: queues of an auto-created topic, per group
# Between two tries of the same broker group (an ordered send waiting for its group to elect a
# leader, or a retry with no other group to go to): doubling from MIN to MAX, or sooner when
# the namesrv's route changes. Our groups elect in about a second.
SAME_GROUP_BACKOFF_S_MIN = 0.02
SAME_GROUP_BACKOFF_S_MAX = 0.25
# One request of a send (to one replica) waits at most REQUEST_S_FIRST for its answer, plus
# REQUEST_S_PER_MIB per MiB of body, before the send goes on to the group's next replica (each
# forwards writes to the leader) or another group: a paused or cut-off leader then costs half a
# second, not the whole send timeout. Each request that runs out doubles the next one's wait,
# so a group that is merely slow still answers within the send timeout.
REQUEST_S_FIRST = 0.5
REQUEST_S_PER_MIB = 0.25
# A group that answers slowly while it works (a saturated broker, say) gets longer: at least
# REQUEST_LATENCY_FACTOR times its slowest recent answer, which halves every
# LATENCY_HALF_LIFE_S, so load does not turn into requests abandoned and sent again elsewhere.
REQUEST_LATENCY_FACTOR = 3.0
LATENCY_HALF_LIFE_S = 2.0  # a fault's one slow answer is forgotten by the next fault
# An answer from a replica that forwarded the write (our broker's raftForwarded) says the route
# names an old master: the route is asked for again, at most this often per topic (a client cut
# off from the leader alone gets such answers for as long as the cut lasts).
FORWARDED_REFRESH_S = 0.5
# After a send had a broker auto-create its topic, the producer asks the namesrvs for the new
# route until they have it (the broker registers it after answering) or this long has passed.
CREATED_ROUTE_WAIT_S = 30.0
# An ordered send keeps choosing among the queues of a group that left the topic's route for
# this long (write_queues.py): RocketMQ's name server drops a broker it has not heard from in 120 s.
ORDERED_GROUP_GRACE_S = 120.0
UNREGISTER_TIMEOUT_S = 1.0  # UNREGISTER_CLIENT to every broker on close, all at once

# --- batches (RocketMQ's MessageBatch splitter) ---------------------------------------------------
BATCH_BYTES_MAX = 4 * MiB  # one SEND_BATCH_MESSAGE's messages, sized as the splitter sizes them
BATCH_LOG_OVERHEAD_BYTES = 20  # the splitter's per-message allowance for the log's own fields
BATCH_MESSAGES_MAX = 1024  # our broker's bound on one batch (one log append); Java has none

# --- async sends ---------------------------------------------------------------------------------
# send_async waits for room past these, so a caller that outruns the brokers is slowed, not
# buffered without end (Java's backPressureForAsyncSendNum / ...Size).
ASYNC_SENDS_MAX = 10_000
ASYNC_SEND_BYTES_MAX = 100 * MiB  # bodies of the async sends in flight

# --- automatic batching (client/auto_batch.py) ----------------------------------------------------
# Batch requests of one topic in flight at once; what is sent meanwhile waits for the next.
# More keeps more groups and queues busy; each request carries at most BATCH_MESSAGES_MAX.
AUTO_BATCH_IN_FLIGHT = 8
# While a request is in flight, another leaves only once this many messages wait (a batch worth
# its request; client/auto_batch.py). With a window of 256 async sends, 32 and 64 gave the same
# rate, both ~20 % above leaving at once (bench.client, session 10).
AUTO_BATCH_EAGER_MESSAGES = 32

# --- the fault tracker (RocketMQ's MQFaultStrategy) -----------------------------------------------
# An answer that took at least LATENCY_STEPS_S[i] (the largest such i) makes the producer avoid that broker group for
# AVOID_STEPS_S[i]; a failure (no answer, a refusal) for FAILURE_AVOID_S. Java uses 30 s to
# 10 min; a group of ours elects a new leader within seconds, so the avoidance is as short.
LATENCY_STEPS_S = (0.05, 0.1, 0.55, 1.0, 2.0, 3.0, 15.0)
AVOID_STEPS_S = (0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 30.0)
FAILURE_AVOID_S = 5.0
# A replica address that failed a request (no connection, no answer, a refusal) is tried after
# the group's other replicas for this long; an answer from it ends that at once.
ADDRESS_AVOID_S = 5.0
# One that gave no answer at all (no connection, a timeout, a closed connection) twice as long:
# when every replica of a group failed, those that answered (alive, electing a leader, say)
# are tried before the one that kept silent (a leader cut off from its peers, still named
# master by the route, costs a whole request wait each time it is tried first)
ADDRESS_SILENT_AVOID_S = 2 * ADDRESS_AVOID_S

assert MESSAGE_BODY_BYTES_MAX <= remoting_limits.MESSAGE_BODY_BYTES_MAX
assert BATCH_BYTES_MAX + 64 * KiB <= remoting_limits.FRAME_BYTES_MAX  # a batch fits one frame
assert len(LATENCY_STEPS_S) == len(AVOID_STEPS_S)
assert list(LATENCY_STEPS_S) == sorted(LATENCY_STEPS_S)
assert list(AVOID_STEPS_S) == sorted(AVOID_STEPS_S)
assert SAME_GROUP_BACKOFF_S_MAX < SEND_TIMEOUT_S_DEFAULT  # a waiting send tries more than once
# a send of the default timeout tries a paused master and then at least two more replicas
assert REQUEST_S_FIRST + 2 * REQUEST_S_FIRST < SEND_TIMEOUT_S_DEFAULT
assert ASYNC_SEND_BYTES_MAX >= MESSAGE_BODY_BYTES_MAX  # the largest message fits alone
