"""Test groups under pytest-xdist (`make test` runs TEST_WORKERS workers; pytest plugin).

A test that uses one of SHARED_BY_WORKER's fixtures runs on the worker of its group, the first that matches: one
rehearsal cluster, one client of the local Slurm's single node at a time, each expensive session fixture built
once. Any other test is grouped with its module, so that its module-scoped fixtures are built once.

xdist's own `--dist loadgroup` cannot carry this on pytest 9: it renames `item._nodeid`, which pytest 9 no longer
reads, so every test became its own group and two workers started the rehearsal cluster at once. Here each worker
writes its tests' groups to a file the controller names (xdist's `workerinput`), and the controller's scheduler
(`GroupScheduling`, xdist's scope scheduler keyed by that file) hands out whole groups, the shared ones first.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

SHARED_BY_WORKER = (
    ("local_cluster", "cluster"),
    ("slurm", "slurm"),
    ("served", "trained-run"),
    ("trained_run", "trained-run"),
    ("adapter_runs", "adapter-runs"),
)
LONGEST_FIRST = ("slurm", "cluster", "tests/test_train_fsdp.py", "trained-run", "adapter-runs",
                 "tests/test_bench_scripts.py", "tests/test_serve_vllm.py", "tests/test_bench_train.py",
                 "tests/test_train_floor.py")
"""the groups that take longest, longest first, by the summed junit durations of a full run from a fresh clone
(2026-12-04 at e0b6377, issue 63: slurm 1,183 s, cluster 1,047 (the README's rehearsal pipeline now the cluster
pipeline tests' one), test_train_fsdp 420, trained-run 297, adapter-runs 175, test_bench_scripts 138,
test_serve_vllm 125, test_bench_train 38, test_train_floor 26). Handing the longest out first (and the short ones
last, to fill the workers' ends) is the longest-processing-time rule: no long group is left to start late and run
alone at the end."""
GROUPS_KEY = "ft_test_groups_file"
groups_file_key = pytest.StashKey[Path]()


def group_of(item: pytest.Item) -> str:
    names = getattr(item, "fixturenames", ())
    markers = {mark.name for mark in item.iter_markers()}
    for fixture, group in SHARED_BY_WORKER:
        if fixture in names or fixture.removeprefix("local_") in markers:
            return group
    return item.nodeid.split("::", 1)[0]


OWNERS = dict(SHARED_BY_WORKER)
ACROSS_WORKERS = ("trained_run",)
"""session fixtures built once per session, in the shared temp folder, by the first worker that asks
(eval_fixtures.trained_run): their own group's, as it starts"""


def borrows(item: pytest.Item, group: str) -> bool:
    """Whether the test uses another group's shared fixture: it runs at its group's end, once that is built."""
    names = getattr(item, "fixturenames", ())
    return any(fixture in names and OWNERS[fixture] != group for fixture in ACROSS_WORKERS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the groups of LONGEST_FIRST in its order, then the shared groups, then the groups with a
    test marked slow, then the rest (the scheduler takes groups in collection order: long groups first leave no long
    group for the end), within a group the tests that borrow another group's fixture last, and every test's group
    written for the controller (the same content from every worker, renamed into place)."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or GROUPS_KEY not in workerinput:
        return
    first = list(dict.fromkeys([*LONGEST_FIRST, *(group for _, group in SHARED_BY_WORKER)]))
    groups = {item.nodeid: group_of(item) for item in items}
    slow = {groups[item.nodeid] for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[int, bool]:
        group = groups[item.nodeid]
        order = first.index(group) if group in first else len(first) + (group not in slow)
        return order, borrows(item, group)

    items.sort(key=rank)
    target = Path(workerinput[GROUPS_KEY])
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(groups))
    os.replace(partial, target)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Controller: tell each worker where to write the groups."""
    config = node.config
    if groups_file_key not in config.stash:
        config.stash[groups_file_key] = Path(tempfile.mkdtemp(prefix="ft-test-groups-")) / "groups.json"
    node.workerinput[GROUPS_KEY] = str(config.stash[groups_file_key])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    # xdist would hand out the groups with the most tests first: the rehearsal cluster's few long tests started 22
    # minutes into a 56-minute run (2026-11-26); the collection order above is the one wanted
    config.option.loadscopereorder = False

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduler with the workers' groups as scopes."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(config.stash[groups_file_key].read_text())
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Controller: the groups' folder goes with the session."""
    if groups_file_key in config.stash:
        shutil.rmtree(config.stash[groups_file_key].parent, ignore_errors=True)
