"""The project's optional C extensions (setup.py), each loaded or None by one rule.

An extension is None where it was not built (no compiler or Python headers: the package
installs without it) and in a process started with `DLEDGER_NO_NATIVE=1`; its Python code then
does the work alone, as it defines what the C does (broker/native.py, remoting/frame.py,
dledger/log/flusher.py). Here, below dledger/ and remoting/, because both have one.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def optional_extension(name: str) -> ModuleType | None:
    """The extension module `name`, or None where it is not built or DLEDGER_NO_NATIVE=1."""
    if os.environ.get("DLEDGER_NO_NATIVE") == "1":
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - a build without a C compiler
        return None
