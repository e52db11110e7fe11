"""dledger-audit's flags and unreadable inputs: exit 2 with the path and the reason, before any
JVM starts (so these tests need no Spark)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark import audit, report, session
from tests.spark import stores


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = audit.main(argv)
    except SystemExit as exit_:  # argparse exits on bad flags
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err


def test_missing_required_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["--stores", "x"], capsys)
    assert code == 2 and "the following arguments are required: --out" in err


def test_unknown_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["--stores", "x", "--out", "y", "--bogus"], capsys)
    assert code == 2 and "unrecognized arguments: --bogus" in err


def test_missing_store_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    code, err = run(["--stores", str(missing), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert err.strip() == f"dledger-audit: unreadable input: {missing}: no such file or directory"


def test_directory_without_stores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    code, err = run(["--stores", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and f"{tmp_path / 'empty'}: no dledger/meta found" in err


def test_corrupt_meta(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = stores.write_replica(tmp_path, "g", "n0", [b"x"], commit_index=1)
    meta = store / "dledger" / "meta"
    stores.flip_byte(meta, 20)
    code, err = run(["--stores", str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and err.strip() == f"dledger-audit: unreadable input: {meta}: crc mismatch"


def test_unreadable_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stores.write_replica(tmp_path / "s", "g", "n0", [b"x"], commit_index=1)
    history = tmp_path / "history.jsonl"
    history.write_text('{"type": "invoke"}\nnot json\n')
    argv = [
        "--stores",
        str(tmp_path / "s"),
        "--out",
        str(tmp_path / "o"),
        "--history",
        str(history),
    ]
    code, err = run(argv, capsys)
    assert code == 2 and f"{history}: line 2: not JSON" in err


def test_duplicate_replica(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stores.write_replica(tmp_path / "a", "g", "n0", [b"x"], commit_index=1)
    stores.write_replica(tmp_path / "b", "g", "n0", [b"x"], commit_index=1)
    argv = ["--stores", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "o")]
    code, err = run(argv, capsys)
    assert code == 2 and "replica n0 of g also found at" in err


def test_manifest_lists_stores(tmp_path: Path) -> None:
    from spark import layout

    stores.write_replica(tmp_path / "x", "g", "n0", [b"x"], commit_index=1)
    stores.write_replica(tmp_path / "y", "g", "n1", [b"x"], commit_index=1)
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"stores": ["x", "%s"]}' % (tmp_path / "y"))
    found = layout.discover([str(manifest)])
    assert [(r.group, r.name, r.commit_index) for r in found] == [("g", "n0", 1), ("g", "n1", 1)]


def test_a_jvm_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    """No traceback: the reason Spark gave, and exit 2 (checked in a process of its own, since
    PySpark keeps one JVM per process)."""
    stores.write_replica(tmp_path / "s", "g", "n0", [b"x"], commit_index=1)
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    result = subprocess.run(
        [sys.executable, "-m", "spark.audit", "--stores", str(tmp_path / "s"),
         "--out", str(tmp_path / "out"), "--quiet"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "dledger-audit: cannot start Spark (local[*]):" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_replica_line_shows_what_was_read_and_sound_beside_the_claim() -> None:
    r = {"entries": 60, "first_index": 1, "last_index": 60, "commit_index": 60}
    assert report.replica_line({**r, "sound_entries": 60, "sound_first_index": 1,
                                "sound_last_index": 60}) == "60 sound entries 1..60, commit 60"  # fmt: skip
    cut = {**r, "sound_entries": 54, "sound_first_index": 1, "sound_last_index": 54}
    assert report.replica_line(cut) == (
        "54 sound entries 1..54 (index files claim 60 entries 1..60), commit 60"
    )


def test_a_bad_driver_memory_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("2x", "0g", "1k", "lots", "1.5g"):
        code, err = run(["--stores", "s", "--out", "o", "--driver-memory", bad], capsys)
        assert code == 2 and f"{bad!r} is not a memory size such as 512m or 8g" in err
    assert (
        audit.parse_args(["--stores", "s", "--out", "o", "--driver-memory", "8G"]).driver_memory
        == "8g"
    )


def test_the_driver_heap_is_a_quarter_of_the_machine_within_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sizes = {"SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(session.os, "sysconf", lambda name: sizes[name])
    for ram_gib, heap in ((4, "2048m"), (24, "6144m"), (256, "16384m")):
        sizes["SC_PHYS_PAGES"] = ram_gib * (1 << 30) // 4096
        assert session.driver_memory_default() == heap
    assert audit.parse_args(["--stores", "s", "--out", "o"]).driver_memory == (
        session.DRIVER_MEMORY_DEFAULT
    )
