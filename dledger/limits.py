"""Every bound of the replicated log, in one place, unit last, with its reason.

Benchmarks set the numbers; the assertions at the bottom keep their relations
true whenever one of them changes.
"""

from __future__ import annotations

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# --- entries and files (docs/formats.md) ---------------------------------------------------------
ENTRY_HEADER_BYTES = 44  # fixed header before every body, see dledger/log/entry.py
ENTRY_BODY_BYTES_MAX = 4 * MiB  # RocketMQ's default maxMessageSize
INDEX_RECORD_BYTES = 32  # one record per entry in the index files
SEGMENT_BYTES_DEFAULT = 1 * GiB  # RocketMQ's commitlog file size
SEGMENT_BYTES_MIN = 4 * KiB  # tests use tiny segments so that rollover happens constantly
INDEX_RECORDS_PER_FILE_DEFAULT = 1 << 20  # 32 MiB index files; one covers ~1 GiB of 1 KiB entries
STATE_FILE_BODY_BYTES_MAX = 1 * MiB  # meta, hardstate, checkpoint are small; read with this bound
SEGMENTS_OPEN_MAX = 32  # mapped segment files per store (2 fds + 1 GiB of address space each)
INDEX_FILES_OPEN_MAX = 8  # mapped index files per store; the least recently used are closed

# --- replication ----------------------------------------------------------------------------------
APPEND_BATCH_BYTES_MAX = (
    1 * MiB
)  # the leader stops filling one AppendEntries here (one entry always)
APPEND_BATCH_ENTRIES_MAX = 4096  # and here, so a batch of tiny entries stays cheap to encode
APPEND_INFLIGHT_MAX = (
    8  # batches per follower: peer memory <= 8 * (APPEND_BATCH_BYTES_MAX + max entry)
)
UNCOMMITTED_BYTES_MAX = 64 * MiB  # a leader refuses proposals beyond this uncommitted backlog
PROPOSAL_ENTRIES_MAX = 8192  # one Propose event carries at most this many payloads

# --- wire -----------------------------------------------------------------------------------------
FRAME_BYTES_MAX = 16 * MiB  # checked on the length prefix, before allocating
FRAME_ENVELOPE_BYTES_MAX = 64 * KiB  # room for everything in a frame that is not entry bodies
PEER_SEND_QUEUE_FRAMES_MAX = 256  # per peer; when full, messages are dropped and Raft resends
CLIENT_PENDING_REQUESTS_MAX = 4096  # per client connection; beyond it the server stops reading
CONNECTIONS_MAX = 1024  # accepted connections per node, peers and clients together
GET_BATCH_ENTRIES_MAX = 4096  # one client read returns at most this many entries

# --- time (the core counts ticks; the node turns ticks into milliseconds) -----------------------
TICK_MS_DEFAULT = 10
HEARTBEAT_TICKS_DEFAULT = 5  # 50 ms: a follower hears the leader ~10 times per election timeout
ELECTION_TICKS_MIN_DEFAULT = 50  # 500 ms: survives event-loop stalls of a loaded Python process
ELECTION_TICKS_MAX_DEFAULT = 100
# On a dropped leader connection, follower k (of the sorted voters) campaigns after k * 3 ticks.
LEADER_LOST_STAGGER_TICKS = 3
PREVOTE_RETRY_TICKS = 2  # a pre-candidate asks again this often (a pre-vote changes no state)
TRANSFER_TICKS_MAX = 50  # a leadership transfer that has not finished by then is abandoned

# --- flush ----------------------------------------------------------------------------------------
FLUSH_INTERVAL_MS_DEFAULT = 500  # ASYNC_FLUSH: RocketMQ's flushIntervalCommitLog
# ASYNC_FLUSH: flush once this many pages are dirty (flushCommitLogLeastPages; RocketMQ's 4
# costs a saturated node here a quarter of its throughput in fsync rounds: docs/decisions.md)
FLUSH_LEAST_PAGES_DEFAULT = 1024  # 4 MiB
# ASYNC_FLUSH with flush_timed: flush whatever is dirty this often
FLUSH_THOROUGH_INTERVAL_MS = 10_000

assert ENTRY_HEADER_BYTES + ENTRY_BODY_BYTES_MAX + FRAME_ENVELOPE_BYTES_MAX <= FRAME_BYTES_MAX
assert APPEND_BATCH_BYTES_MAX + FRAME_ENVELOPE_BYTES_MAX <= FRAME_BYTES_MAX  # a full batch fits
assert ENTRY_HEADER_BYTES + ENTRY_BODY_BYTES_MAX <= SEGMENT_BYTES_DEFAULT  # no entry spans segments
assert ELECTION_TICKS_MIN_DEFAULT > 2 * HEARTBEAT_TICKS_DEFAULT  # one lost beat is no election
assert ELECTION_TICKS_MIN_DEFAULT < ELECTION_TICKS_MAX_DEFAULT  # randomised, so split votes resolve
assert LEADER_LOST_STAGGER_TICKS * 4 < ELECTION_TICKS_MIN_DEFAULT  # 5 nodes stagger in a timeout
assert TRANSFER_TICKS_MAX <= ELECTION_TICKS_MAX_DEFAULT
assert PROPOSAL_ENTRIES_MAX <= CLIENT_PENDING_REQUESTS_MAX * 2
