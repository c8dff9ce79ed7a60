"""The wheelhouse (infra.environment.source) downloads wheels for the lock's target Python and platform, not for the
operator's machine: the jail target (CPython 3.12, manylinux_2_28 x86_64) from this Python 3.11 process, on a
two-package cut of the real jail lock (one cp312 manylinux wheel, one pure) and uv's wheel, from PyPI."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from infra.environment import lock, serving_lock, source
from infra.environment.lock import TARGETS
from infra.environment.source import INSTALL_FILE, WHEELS, _blocks, manylinux_platforms, serving_wheelhouse, wheelhouse

PACKAGES = ("markupsafe", "annotated-types")
"""A C extension (a 23 kB cp312 manylinux wheel in the jail lock) and a pure-Python wheel."""


def tables(pylock: str, names: set[str]) -> str:
    """The [[packages]] tables of a PEP 751 lock for `names`, as written."""
    kept = [table for table in pylock.split("\n[[packages]]\n")[1:]
            if re.match(r'name = "([^"]+)"', table).group(1) in names]
    assert len(kept) == len(names), names
    return "".join(f"\n[[packages]]\n{table.rstrip()}\n" for table in kept)


@pytest.fixture
def small_jail_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """locks/ holding the jail lock cut to PACKAGES, and the local lock's uv (the wheelhouse's installer)."""
    locks = tmp_path / "locks"
    locks.mkdir()
    jail, local = TARGETS["jail"], TARGETS["local"]
    blocks = _blocks(jail.file.read_text())
    (locks / jail.file.name).write_text("".join(blocks[name] for name in PACKAGES))
    head = 'lock-version = "1.0"\ncreated-by = "uv"\n'
    (locks / jail.pylock.name).write_text(head + tables(jail.pylock.read_text(), set(PACKAGES)))
    (locks / local.pylock.name).write_text(head + tables(local.pylock.read_text(), {"uv"}))
    monkeypatch.setattr(lock, "LOCK_DIR", locks)
    return locks


def test_the_jail_wheelhouse_is_built_from_a_python_that_is_not_the_jail_s(
        small_jail_lock: Path, tmp_path: Path) -> None:
    jail = TARGETS["jail"]
    assert f"{sys.version_info.major}.{sys.version_info.minor}" != jail.python
    house = wheelhouse(jail, tmp_path / "cache")
    names = sorted(wheel.name for wheel in (house / WHEELS).iterdir())
    assert [name.split("-")[0].lower() for name in names] == ["annotated_types", "markupsafe", "uv"]
    assert re.fullmatch(r"markupsafe-[\d.]+-cp312-cp312-.*manylinux_2_28_x86_64\.whl", names[1]), names
    assert (house / INSTALL_FILE).read_text() == (small_jail_lock / jail.file.name).read_text()


def test_a_wheelhouse_another_run_published_meanwhile_is_kept(
        small_jail_lock: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs at once (two stacks' `ftstack run` on one lock): while this build downloads, another builds and
    publishes the same key; this one then finds the folder taken and returns the complete one."""
    jail, cache = TARGETS["jail"], tmp_path / "cache"
    download, builds = source._pip_download, []

    def download_while_another_publishes(*args: object) -> None:
        download(*args)
        builds.append("started")
        if len(builds) == 1:
            builds.append(wheelhouse(jail, cache))

    monkeypatch.setattr(source, "_pip_download", download_while_another_publishes)
    house = wheelhouse(jail, cache)
    assert builds == ["started", "started", house] and (house / INSTALL_FILE).is_file()
    assert sorted(p.name for p in cache.iterdir()) == [house.name], "the losing build's staging is left behind"


def test_pip_is_given_every_glibc_tag_the_target_accepts() -> None:
    tags = manylinux_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "manylinux1_x86_64"
    # PEP 600's legacy aliases sit beside the glibc version they stand for
    for legacy, minor in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
        assert tags.index(f"{legacy}_x86_64") == tags.index(f"manylinux_2_{minor}_x86_64") + 1
    assert len(tags) == (28 - 5 + 1) + 3


def test_the_serving_wheelhouse_holds_the_serving_lock_s_wheels_for_the_jail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 53: the serving lock (no PEP 751 file) gets its wheels by its own hashes, for cp312 manylinux_2_28 from
    this Python 3.11, on a two-package cut of locks/requirements-serve-jail.txt; its install file is the lock."""
    target = serving_lock.SERVE_TARGETS["serve-jail"]
    blocks = _blocks(target.file.read_text())
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / target.file.name).write_text("".join(blocks[name] for name in PACKAGES))
    monkeypatch.setattr(serving_lock, "LOCK_DIR", locks)
    house = serving_wheelhouse(target, tmp_path / "cache")
    names = sorted(wheel.name for wheel in (house / WHEELS).iterdir())
    assert [name.split("-")[0].lower() for name in names] == ["annotated_types", "markupsafe"]
    assert re.fullmatch(r"markupsafe-[\d.]+-cp312-cp312-.*manylinux_2_28_x86_64\.whl", names[1]), names
    assert (house / INSTALL_FILE).read_text() == (locks / target.file.name).read_text()
