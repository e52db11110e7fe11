# The C half of the dispatcher: broker/dispatch_native.c says what each function does.

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
) -> tuple[int, int, int, int, int, int, int, int]: ...
