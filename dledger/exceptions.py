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
