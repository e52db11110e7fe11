"""Every bound of the remoting layer, in one place, unit last, with its reason.

Memory per connection is at most (REQUESTS_IN_FLIGHT_MAX + OUTBOX_FRAMES_MAX) answers plus one
frame being read; the relations at the bottom keep the numbers consistent.
"""

from __future__ import annotations

KiB, MiB = 1 << 10, 1 << 20

# --- frames (docs/protocol.md#remoting-frame) -----------------------------------------------------
FRAME_BYTES_MAX = 16 * MiB  # Java's com.rocketmq.remoting.frameMaxLength; checked before allocating
LENGTH_BYTES = 4  # the length prefix, not counted in itself
HEADER_MARK_BYTES = 4  # serialization type (high byte) and header length (low 24 bits)
HEADER_BYTES_MAX = (1 << 24) - 1  # the header length has 24 bits
EXT_FIELDS_MAX = 256  # keys in one header's extFields; RocketMQ's largest header has ~15
MESSAGE_BODY_BYTES_MAX = 4 * MiB  # RocketMQ's default maxMessageSize, for the broker's checks

# --- connections ----------------------------------------------------------------------------------
RECEIVE_BYTES = 256 * KiB  # one read from a stream
CONNECTIONS_MAX = 4096  # per server; one more is closed at once with a log line
# Requests of one connection being handled at once. Each is its own task, so a long-polled pull
# never blocks the others; past this the request is answered SYSTEM_BUSY at once, as Java does
# when a processor's pool rejects it. A consumer holds one pull per queue it owns on a broker.
REQUESTS_IN_FLIGHT_MAX = 1024
# Requests of one code with a batch handler (the broker's sends) read from a connection in one
# go are handled as one batch (one task, one append, answers in one write) up to this many and
# this many body bytes; a larger request is handled on its own.
BATCH_REQUESTS_MAX = 64
BATCH_BODY_BYTES_MAX = 1 * MiB
# Frames waiting for the connection's one writer. A full outbox makes handlers wait, and the
# reader stops reading, so TCP pushes back on a peer that sends but does not read.
OUTBOX_FRAMES_MAX = 256
# Our own requests on one connection awaiting their response (client requests, or the broker's
# NOTIFY_CONSUMER_IDS_CHANGED / CHECK_TRANSACTION_STATE to a client).
PENDING_RESPONSES_MAX = 4096
REQUEST_TIMEOUT_S_DEFAULT = 3.0  # the C++ client's default for a synchronous request
CLOSE_FLUSH_S = 1.0  # how long a closing connection tries to send what is queued

assert LENGTH_BYTES + HEADER_MARK_BYTES < FRAME_BYTES_MAX
assert MESSAGE_BODY_BYTES_MAX + 64 * KiB <= FRAME_BYTES_MAX  # a message and its header fit a frame
assert HEADER_BYTES_MAX < FRAME_BYTES_MAX  # the frame's bound is the tighter one for headers
assert REQUESTS_IN_FLIGHT_MAX >= 64  # a consumer owning many queues of one broker long-polls each
assert RECEIVE_BYTES <= FRAME_BYTES_MAX
assert BATCH_REQUESTS_MAX <= REQUESTS_IN_FLIGHT_MAX

# Requests already read when a client closes its connection are still handled for this long
# (a send's own timeout is 3 s); held pulls and the like are cancelled after it.
CLOSED_REQUESTS_GRACE_S = 5.0

# --- stored message (docs/formats.md#stored-message) -------------------------------------------
# RocketMQ's maxMessageSize (4 MiB) bounds the whole stored record in its CommitLog (the broker
# also checks it fits one log entry: broker/limits.py).
STORED_MESSAGE_BYTES_MAX = 4 * MiB
PROPERTIES_BYTES_MAX = 32767  # the stored length is a signed int16 (Java reads getShort())
TOPIC_BYTES_MAX_V1 = 127  # V1 stores the topic length in one byte that Java reads as signed
TOPIC_BYTES_MAX_V2 = 32767  # V2 stores it in a signed int16
assert PROPERTIES_BYTES_MAX == (1 << 15) - 1
assert TOPIC_BYTES_MAX_V1 == (1 << 7) - 1
