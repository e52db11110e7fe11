# The C half of the dispatcher: broker/dispatch_native.c says what each function does.

from collections.abc import Callable
from typing import Any

ITEM_BYTES: int
UNIT_BYTES: int

def scan(
    payloads: list[bytes],
    positions: list[int] | None,
    kinds: list[int],
    data_kind: int,
    start: int,
    header_bytes: int,
    special_topics: tuple[bytes, ...],
    stop_keys: tuple[bytes, ...],
    items_max: int,
    /,
) -> tuple[int, list[tuple[str, int, int, bytes]], bytes]: ...
def index_put(
    mm: object,
    items: bytes,
    at: int,
    slot_count: int,
    item_count: int,
    index_count: int,
    hash_slot_count: int,
    begin_timestamp_ms: int,
    begin_phy_offset: int,
    end_timestamp_ms: int,
    end_phy_offset: int,
    /,
) -> tuple[int, int, int, int, int, int, int]: ...
def shape(
    payloads: list[bytes],
    positions: list[int],
    start: int,
    first_index: int,
    header_bytes: int,
    next_offsets: dict[tuple[str, int], int],
    stop_keys: tuple[bytes, ...],
    placed_type: type,
    shaped: list[bytes],
    keys: list[tuple[str, int]],
    placed: list[tuple[int, Any]],
    /,
) -> int: ...
def pack_batch(
    body: bytes,
    head: bytes,
    topic_part: bytes,
    cluster_pair: bytes,
    markers: tuple[bytes, ...],
    record_max: int,
    properties_max: int,
    messages_max: int,
    crc: Callable[[Any], int],
    /,
) -> tuple[list[bytes], bytes] | None: ...
def send_fields(
    ext_fields: dict[str, str], names: tuple[str, ...], /
) -> tuple[str, int, int, int, int, str | None, int] | None: ...
def pack_plain(
    body: bytes,
    flag: int,
    properties: bytes,
    cluster_pair: bytes,
    markers: tuple[bytes, ...],
    topic_part: bytes,
    queue_id: int,
    sys_flag: int,
    born_timestamp_ms: int,
    born_host: bytes,
    store_timestamp_ms: int,
    store_host: bytes,
    reconsume_times: int,
    record_max: int,
    properties_max: int,
    crc: Callable[[Any], int],
    /,
) -> bytes | None: ...
