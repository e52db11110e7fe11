"""The C half of the dispatcher (broker/dispatch_native.c), or None where it was not built.

It is an optional extension (setup.py): without a C compiler the package installs and the
dispatcher runs in Python alone, which is also the definition the C half is tested against
(tests/broker/test_dispatch_native.py). `DLEDGER_NO_NATIVE=1` turns it off for a process.
"""

from __future__ import annotations

from netio.native import optional_extension

native = optional_extension("broker._dispatch_native")
