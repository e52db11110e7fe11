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
def prepare_plains(
    requests: list[Any],
    names_v1: tuple[str, ...],
    names_v2: tuple[str, ...],
    code_v1: int,
    code_v2: int,
    topics: dict[str, Any],
    topic_part_of: Callable[[str], bytes | None],
    markers: tuple[bytes, ...],
    born_host: bytes,
    store_host: bytes,
    cluster_pair: bytes,
    store_timestamp_ms: int,
    record_max: int,
    properties_max: int,
    perm_write: int,
    transaction_bits: int,
    prepared: int,
    crc: Callable[[Any], int],
    prepared_type: type[Any],
    /,
) -> list[Any]: ...
def send_ok_frames(
    answering: list[Any],
    placed: list[Any],
    first: int,
    parts: tuple[bytes, ...],
    json: object,
    responses: list[Any],
    /,
) -> list[Any]: ...
