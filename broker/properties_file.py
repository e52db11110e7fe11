"""broker.properties as RocketMQ's files write it: Java .properties, read strictly enough that
a file which would mean something else to Java is refused with its line, never misread.

(Not remoting/properties.py: that is a stored message's properties string.)
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from dledger.config import ConfigError


@attrs.frozen
class Property:
    value: str
    origin: str  # "broker.properties:12"


PROPERTY_LINE = re.compile(r"^([^=:\s]+)\s*[=:]?\s*(.*)$")


def parse_properties(text: str, source: str) -> dict[str, Property]:
    """Java .properties as RocketMQ's files use it: `key=value`, `key: value` or `key value`,
    `#`/`!` comments, blank lines, whitespace trimmed. Backslash escapes and continuation
    lines are refused rather than misread; so is a key given twice (Java keeps the last)."""
    found: dict[str, Property] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        origin = f"{source}:{number}"
        match = PROPERTY_LINE.match(stripped)
        if match is None:
            raise ConfigError(f"{origin}: no key before {stripped[0]!r}")
        key, value = match.group(1), match.group(2).strip()
        if "\\" in stripped:
            raise ConfigError(f"{origin}: {key}: backslash escapes are not supported")
        if key in found:
            raise ConfigError(f"{origin}: {key} is already set at {found[key].origin}")
        found[key] = Property(value, origin)
    return found


def read_properties(path: Path) -> dict[str, Property]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_properties(text, str(path))
