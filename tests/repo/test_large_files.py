""".ci/large-files: a tracked file over 1 MiB fails the check unless it is on the allow-list."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "large-files"
MIB = 1024 * 1024


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                   cwd=repo, check=True, capture_output=True)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A git repository holding a copy of the check and one small file, all committed."""
    _git(tmp_path, "init", "-q")
    (tmp_path / ".ci").mkdir()
    shutil.copy(SCRIPT, tmp_path / ".ci" / "large-files")
    (tmp_path / "README.md").write_text("small\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "start")
    return tmp_path


def _check(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(repo / ".ci" / "large-files")], capture_output=True, text=True, check=False)


def _write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x00" * size)


def test_a_repository_of_small_files_passes(repo: Path) -> None:
    assert _check(repo).returncode == 0


@pytest.mark.parametrize("committed", [False, True], ids=["staged", "committed"])
def test_a_tracked_file_over_one_mib_fails_naming_it(repo: Path, committed: bool) -> None:
    _write(repo / "dist" / "some tool-1.0-py3-none-any.whl", MIB + 1)
    _git(repo, "add", "-f", ".")
    if committed:
        _git(repo, "commit", "-q", "-m", "big")

    result = _check(repo)

    assert result.returncode == 1
    assert "dist/some tool-1.0-py3-none-any.whl: 1048577 bytes" in result.stderr


def test_a_file_of_exactly_one_mib_passes(repo: Path) -> None:
    _write(repo / "data.bin", MIB)
    _git(repo, "add", ".")
    assert _check(repo).returncode == 0


def test_an_untracked_large_file_is_not_the_checks_business(repo: Path) -> None:
    _write(repo / "local.bin", 2 * MIB)
    assert _check(repo).returncode == 0


def test_the_allow_listed_screenshot_may_be_large(repo: Path) -> None:
    _write(repo / "docs" / "bos-ui-page.png", 2 * MIB)
    _git(repo, "add", ".")
    assert _check(repo).returncode == 0


def test_the_allow_list_names_a_path_not_a_file_name(repo: Path) -> None:
    _write(repo / "elsewhere" / "bos-ui-page.png", 2 * MIB)
    _git(repo, "add", ".")

    result = _check(repo)

    assert result.returncode == 1
    assert "elsewhere/bos-ui-page.png" in result.stderr


def test_a_removed_large_file_no_longer_fails(repo: Path) -> None:
    _write(repo / "big.whl", 2 * MIB)
    _git(repo, "add", "-f", ".")
    _git(repo, "commit", "-q", "-m", "big")
    assert _check(repo).returncode == 1

    _git(repo, "rm", "-q", "big.whl")

    assert _check(repo).returncode == 0
