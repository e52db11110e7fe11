"""A class-data-sharing archive of the Spark driver JVM's classes, so the audit starts faster.

A fresh Spark driver loads and verifies ~14,000 classes before and during its first jobs;
on this project's 2-core machine that was ~8 s of a ~30 s audit. JDK 17 can dump the classes
a JVM loaded into an archive when it exits (-XX:ArchiveClassesAtExit) and map that archive
into later JVMs (-XX:SharedArchiveFile). `dledger-audit-prepare` (spark/prepare.py) makes the
archive once, with a short run of the audit's kinds of Spark work on made-up rows; every later
`dledger-audit` (and the benchmark, and the tests' session) uses it when it exists.

The archive belongs to one JVM, one set of Spark jars and one set of JVM options, so its file
name carries a fingerprint of all three: after an upgrade the old file is simply not found
(run the command again). A JVM that still refuses an archive starts without it, silently.
Only the driver uses it: in local mode that is the whole of Spark.

This module only finds the archive (spark/session.py asks it for the driver's options); the
command that makes one is spark/prepare.py, which starts a session, so that the two do not
import each other.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pyspark

CACHE_ENV = "DLEDGER_AUDIT_CACHE"  # where archives live; default ~/.cache/dledger-audit
QUIET_OPTIONS = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a refused archive is not an error


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dledger-audit"


def _java() -> Path | None:
    """The java binary Spark's launcher runs: $JAVA_HOME/bin/java, else java on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def fingerprint(jvm_options: str) -> str:
    """What an archive is only valid for: the JVM, Spark's jars and the JVM options."""
    parts = [pyspark.__version__, jvm_options]
    java = _java()
    if java is not None:
        for path in (java, java.parent.parent / "lib" / "server" / "libjvm.so"):
            if path.exists():
                stat = path.stat()
                parts.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    jars = Path(pyspark.__file__).parent / "jars"
    if jars.is_dir():
        parts += sorted(f"{p.name}:{p.stat().st_size}" for p in jars.iterdir())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path(jvm_options: str) -> Path:
    return cache_dir() / f"spark-driver-{fingerprint(jvm_options)}.jsa"


def use_options(jvm_options: str) -> str:
    """Options that map the archive for these JVM options into the driver, if there is one."""
    path = archive_path(jvm_options)
    return f"-XX:SharedArchiveFile={path} {QUIET_OPTIONS}" if path.is_file() else ""


def describe(jvm_options: str) -> str:
    path = archive_path(jvm_options)
    if path.is_file():
        return f"JVM class archive: {path}"
    return "no JVM class archive for this JVM and Spark (dledger-audit-prepare makes one)"
