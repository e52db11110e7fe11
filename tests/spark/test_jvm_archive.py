"""The JVM class archive (spark/jvm_archive.py): where it lives, when the driver maps it, and
that an archive made by dledger-audit-prepare is one a driver JVM really maps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark import jvm_archive, prepare, session
from tests.spark.stores import write_group

REPO = Path(__file__).parents[2]


def test_the_cache_is_the_environment_s_or_the_user_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jvm_archive.CACHE_ENV, str(tmp_path))
    assert jvm_archive.cache_dir() == tmp_path
    monkeypatch.delenv(jvm_archive.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jvm_archive.cache_dir() == tmp_path / "xdg" / "dledger-audit"


def test_an_archive_is_only_named_for_its_jvm_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jvm_archive.CACHE_ENV, str(tmp_path))
    ours = jvm_archive.archive_path(session.JVM_OPTIONS)
    assert ours.parent == tmp_path and ours.suffix == ".jsa"
    assert jvm_archive.archive_path(session.JVM_OPTIONS + " -Xss4m") != ours
    assert jvm_archive.archive_path(session.JVM_OPTIONS) == ours  # stable


def test_the_driver_maps_an_archive_only_when_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jvm_archive.CACHE_ENV, str(tmp_path))
    assert jvm_archive.use_options(session.JVM_OPTIONS) == ""
    assert "dledger-audit-prepare makes one" in jvm_archive.describe(session.JVM_OPTIONS)
    path = jvm_archive.archive_path(session.JVM_OPTIONS)
    path.write_bytes(b"an archive")
    assert f"-XX:SharedArchiveFile={path}" in jvm_archive.use_options(session.JVM_OPTIONS)
    assert jvm_archive.describe(session.JVM_OPTIONS) == f"JVM class archive: {path}"


def test_a_bad_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        prepare.main(["--bogus"])
    assert exit_.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.spark
def test_a_prepared_archive_is_mapped_by_the_audit_s_driver(archive: Path, tmp_path: Path) -> None:
    assert archive.is_file() and archive.stat().st_size > 10 << 20
    again = subprocess.run(
        [sys.executable, "-m", "spark.prepare", "--cache", str(archive.parent)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 0 and f"{archive} exists" in again.stdout
    write_group(tmp_path / "stores", "g", 30)
    # -Xshare:on: a JVM that cannot map the archive exits instead of quietly starting without
    env = {**os.environ, "JAVA_TOOL_OPTIONS": "-Xshare:on"}
    result = subprocess.run(
        [sys.executable, "-m", "spark.audit", "--stores", str(tmp_path / "stores"),
         "--out", str(tmp_path / "out"), "--master", "local[1]"],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"JVM class archive: {archive}" in result.stderr
    assert "CONSISTENT" in result.stdout
