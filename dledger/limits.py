"""Every bound of the replicated log, in one place, unit last, with its reason.

Benchmarks set the numbers; the assertions at the bottom keep their relations true whenever one
of them changes, each with the reason it must hold. A bound of one module only (a struct size,
a codec's own constant) stays beside its code; a bound that decides memory, time or what fits
in what lives here.
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
RECENT_APPENDS_BYTES_MAX = 16 * MiB  # bodies appended last, kept for the applier's read-back

# --- replication ----------------------------------------------------------------------------------
APPEND_BATCH_BYTES_MAX = (
    1 * MiB
)  # the leader stops filling one AppendEntries here (one entry always)
APPEND_BATCH_ENTRIES_MAX = 4096  # and here, so a batch of tiny entries stays cheap to encode
# batches in flight per follower: its memory <= 8 * (APPEND_BATCH_BYTES_MAX + one entry)
APPEND_INFLIGHT_MAX = 8
UNCOMMITTED_BYTES_MAX = 64 * MiB  # a leader refuses proposals beyond this uncommitted backlog
PROPOSAL_ENTRIES_MAX = 8192  # one Propose event carries at most this many payloads

# --- wire -----------------------------------------------------------------------------------------
FRAME_BYTES_MAX = 16 * MiB  # checked on the length prefix, before allocating
FRAME_ENVELOPE_BYTES_MAX = 64 * KiB  # room for everything in a frame that is not entry bodies
RECEIVE_BYTES = 256 * KiB  # one read from a socket, peers and clients alike (a few batches)
PEER_SEND_QUEUE_FRAMES_MAX = 256  # per peer; when full, messages are dropped and Raft resends
SEND_COALESCE_BYTES_MAX = 4 * MiB  # one send_all to a peer carries at most this (plus one frame)
PEER_FRAME_CACHE_MAX = 8  # AppendEntries frames kept to re-send the same bytes to other followers
PEER_REFUSAL_BYTES_MAX = 4 * KiB  # a peer only ever answers our link with a short refusal
PEER_RECONNECT_MS_MIN = 5  # a link retries this soon after a failure: a restarted peer is back fast
PEER_RECONNECT_MS_MAX = 500  # and backs off to this while the peer stays away
PEER_CONNECT_TIMEOUT_S = 1.0  # a connect across a partition gives up here and backs off
CLIENT_PENDING_REQUESTS_MAX = 4096  # per client connection; beyond it the server stops reading
CONNECTIONS_MAX = 1024  # accepted connections per node, peers and clients together
FIRST_FRAME_TIMEOUT_S = 10.0  # an accepted connection that says nothing for this long is closed
GET_BATCH_ENTRIES_MAX = 4096  # one client read returns at most this many entries
GET_BYTES_MAX = 4 * MiB  # and at most this much body (one entry always)

# --- dledger-client (dledger/client.py) ----------------------------------------------------------
CLIENT_TIMEOUT_S_DEFAULT = 5.0  # a request's default deadline, retries included
CLIENT_CONNECT_TIMEOUT_S = 1.0  # one connect attempt; a dead replica costs at most this
CLIENT_RETRY_SLEEP_S_MIN = 0.002  # after a refusal with no leader known: elections take ms
CLIENT_RETRY_SLEEP_S_MAX = 0.02  # a client waiting out an election asks at least this often
CLIENT_APPEND_BATCH_BYTES_MAX = 4 * MiB  # concurrent appends share one request up to here

# --- the node's own loops (dledger/node.py) --------------------------------------------------------
INBOX_EVENTS_MAX = 4096  # events waiting for the raft loop; beyond it, senders wait
DRAIN_EVENTS_MAX = 512  # events one raft-loop wake-up handles before it proposes
# A leader with at least this many entries pending is under load (appends come in reads of
# many requests): before proposing, its raft loop yields once (trio's checkpoint: every task
# ready to run goes first), so that appends those tasks make join the proposal. Fewer
# pending: it proposes at once, as a lone client's append must not wait (docs/decisions.md).
PROPOSE_DEFER_ENTRIES_MIN = 16
APPLY_BATCH_ENTRIES_MAX = 4096  # entries handed to the state machine in one apply call
APPLY_BATCH_BYTES_MAX = 4 * APPEND_BATCH_BYTES_MAX  # and their bodies' bytes (one entry always)
MAINTENANCE_INTERVAL_S = 0.25  # expiring appends, checkpoints: due times are checked this often
RETENTION_INTERVAL_S = 60.0  # old segments are looked for this often
APPEND_TIMEOUT_MS_DEFAULT = 30_000  # a waiting append is answered OUTCOME_UNKNOWN after this
CHECKPOINT_INTERVAL_MS_DEFAULT = 1000  # commit and applied index are written this often
GC_YOUNG_ALLOCATIONS = 20_000  # a serving process's young collection runs this often (not 700)

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
# a flush takes the index files appends wrote along at most this often (their records are
# rebuilt from the data after a crash; only the checkpoint needs them synced, and it is written
# every CHECKPOINT_INTERVAL_MS_DEFAULT): one index fdatasync a round cost SYNC_FLUSH a third of
# its fsync time (docs/decisions.md)
INDEX_SYNC_INTERVAL_MS = 200
CACHE_TAIL_BYTES_DEFAULT = 1 * GiB

# --- relations, each with its reason -------------------------------------------------------------
# the largest entry travels in one frame, with its envelope
assert ENTRY_HEADER_BYTES + ENTRY_BODY_BYTES_MAX + FRAME_ENVELOPE_BYTES_MAX <= FRAME_BYTES_MAX
# a full AppendEntries batch fits one frame (the leader fills batches up to this)
assert APPEND_BATCH_BYTES_MAX + FRAME_ENVELOPE_BYTES_MAX <= FRAME_BYTES_MAX
# no entry spans two segments (RocketMQ's rule; the writer pads a segment's tail instead)
assert ENTRY_HEADER_BYTES + ENTRY_BODY_BYTES_MAX <= SEGMENT_BYTES_DEFAULT
assert ENTRY_HEADER_BYTES + ENTRY_BODY_BYTES_MAX <= FRAME_BYTES_MAX
# a client append request carrying the client's largest batch is one frame
assert (
    CLIENT_APPEND_BATCH_BYTES_MAX + ENTRY_BODY_BYTES_MAX + FRAME_ENVELOPE_BYTES_MAX
    <= FRAME_BYTES_MAX
)
# a GET answer (its byte bound plus the one entry it may always carry) is one frame
assert GET_BYTES_MAX + ENTRY_BODY_BYTES_MAX + FRAME_ENVELOPE_BYTES_MAX <= FRAME_BYTES_MAX
# a peer's send coalesces several frames, but never grows past what one frame may be
assert SEND_COALESCE_BYTES_MAX <= FRAME_BYTES_MAX
# peer memory per link is bounded: the queue holds at most this many frames, each <= a frame
assert PEER_SEND_QUEUE_FRAMES_MAX >= APPEND_INFLIGHT_MAX  # the pipeline never drops itself
# a reading task needs several reads per frame at most, and never one larger than a frame
assert RECEIVE_BYTES <= FRAME_BYTES_MAX
# the applier's read bound holds several full AppendEntries batches (the store's range read
# returns one entry even past the bound, so no entry is ever too large to apply)
assert APPLY_BATCH_BYTES_MAX >= 2 * APPEND_BATCH_BYTES_MAX
# one wake-up of the raft loop drains fewer events than the inbox holds: a full inbox empties
assert DRAIN_EVENTS_MAX < INBOX_EVENTS_MAX
# one election timeout sees heartbeats, so one lost beat is no election
assert ELECTION_TICKS_MIN_DEFAULT > 2 * HEARTBEAT_TICKS_DEFAULT
assert ELECTION_TICKS_MIN_DEFAULT < ELECTION_TICKS_MAX_DEFAULT  # randomised, so split votes resolve
assert LEADER_LOST_STAGGER_TICKS * 4 < ELECTION_TICKS_MIN_DEFAULT  # 5 nodes stagger in a timeout
# a transfer that fails gives leadership back before the followers' timeouts would elect anew
assert TRANSFER_TICKS_MAX <= ELECTION_TICKS_MAX_DEFAULT
# a peer that cannot connect retries several times within one election timeout
assert PEER_CONNECT_TIMEOUT_S * 1000 <= 2 * ELECTION_TICKS_MIN_DEFAULT * TICK_MS_DEFAULT
assert PEER_RECONNECT_MS_MAX <= ELECTION_TICKS_MIN_DEFAULT * TICK_MS_DEFAULT
# a client's retry loop polls well within an election timeout, so it sees the new leader early
assert CLIENT_RETRY_SLEEP_S_MAX * 1000 < ELECTION_TICKS_MIN_DEFAULT * TICK_MS_DEFAULT
# one proposal carries what a full client connection may have pipelined (twice over)
assert PROPOSAL_ENTRIES_MAX <= CLIENT_PENDING_REQUESTS_MAX * 2
# expiring appends and checkpoints are looked at several times per their own deadlines
assert MAINTENANCE_INTERVAL_S * 1000 * 4 <= CHECKPOINT_INTERVAL_MS_DEFAULT
# a checkpoint's durable index lags the data's by at most about one index sync interval
assert INDEX_SYNC_INTERVAL_MS <= CHECKPOINT_INTERVAL_MS_DEFAULT
assert MAINTENANCE_INTERVAL_S * 1000 < APPEND_TIMEOUT_MS_DEFAULT
