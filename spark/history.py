"""Read a chaos run's history.jsonl (docs/formats.md#chaos-history): the acknowledged appends.

Only `ok` completions of `append` by client processes matter to the audit: each promises that
its value (UTF-8) is the body of the entry at its acknowledged index in its group's committed
log. Everything else (invocations, fail, info, nemesis records) is skipped. A line that is not
valid JSON, or an `ok` append without its group or value, makes the history unreadable: the
audit cannot vouch for what it cannot parse.
"""

from __future__ import annotations

import json

import attrs

from spark.layout import InputUnreadable, filesystem

HISTORY_LINE_BYTES_MAX = 16 << 20  # one operation; appends carry values up to 4 MiB as JSON


@attrs.frozen
class AckedAppend:
    group: str
    index: int | None  # the index the server acknowledged; None if the history lacks it
    value: str
    process: str
    time_ns: int


def read_acked(path: str) -> list[AckedAppend]:
    """Every acknowledged append in the history at `path`, in recorded order."""
    fs, local = filesystem(path)
    acked: list[AckedAppend] = []
    try:
        with fs.open_input_stream(local) as stream:
            data = stream.read()
    except OSError as err:
        raise InputUnreadable(path, str(err)) from err
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        if len(line) > HISTORY_LINE_BYTES_MAX:
            raise InputUnreadable(path, f"line {number}: longer than {HISTORY_LINE_BYTES_MAX}")
        try:
            op = json.loads(line)
        except ValueError as err:
            raise InputUnreadable(path, f"line {number}: not JSON: {err}") from err
        if not isinstance(op, dict):
            raise InputUnreadable(path, f"line {number}: not a JSON object")
        if op.get("type") != "ok" or op.get("f") != "append" or op.get("process") == "nemesis":
            continue
        group, value, index = op.get("group"), op.get("value"), op.get("index")
        if not isinstance(group, str) or not isinstance(value, str):
            raise InputUnreadable(path, f"line {number}: ok append without a string group/value")
        if index is not None and (not isinstance(index, int) or index < 1):
            raise InputUnreadable(path, f"line {number}: index {index!r} is not an index")
        acked.append(
            AckedAppend(group, index, value, str(op.get("process")), int(op.get("time_ns") or 0))
        )
    return acked
