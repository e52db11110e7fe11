"""The C half of the dispatcher (broker/dispatch_native.c), or None where it was not built.

It is an optional extension (setup.py): without a C compiler the package installs and the
dispatcher runs in Python alone, which is also the definition the C half is tested against
(tests/broker/test_dispatch_native.py). `DLEDGER_NO_NATIVE=1` turns it off for a process.
"""

from __future__ import annotations

import os
from types import ModuleType

native: ModuleType | None
try:
    from broker import _dispatch_native as native
except ImportError:  # pragma: no cover - a build without a C compiler
    native = None
if os.environ.get("DLEDGER_NO_NATIVE") == "1":
    native = None
