"""Finding the errors inside trio's exception groups, for the one place a CLI reports them."""

from __future__ import annotations

from collections.abc import Iterator


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """Every exception in `exc`, looking inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def find(
    exc: BaseException, kind: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first exception in `exc` of the given kind, or None."""
    return next((leaf for leaf in leaves(exc) if isinstance(leaf, kind)), None)


def operator_error(exc: BaseException, prog: str, store: object) -> str | None:
    """The one line a server CLI prints for what an operator can fix (a store that cannot be
    opened, a port that cannot be bound), or None when `exc` is a bug to re-raise."""
    from dledger.log.errors import LogError  # the log package imports nothing from here

    store_error = find(exc, LogError)
    if store_error is not None:
        return f"{prog}: cannot open store {store}: {store_error}"
    os_error = find(exc, OSError)
    if os_error is not None:
        return f"{prog}: {os_error}"
    return None
