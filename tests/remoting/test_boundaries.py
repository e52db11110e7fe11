"""remoting/ is shared by the broker, the name server and the client: it imports none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("broker", "namesrv", "client", "dledger", "chaos", "spark")

CHECK = f"""
import pkgutil, importlib, sys
import remoting
for module in pkgutil.iter_modules(remoting.__path__, "remoting."):
    importlib.import_module(module.name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r})
assert not bad, bad
"""


def test_remoting_imports_no_program_package() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
