"""tests/xdist_groups.py's table of the longest groups names groups the suite has (a renamed test file would
silently drop its group to the back of the queue)."""

from __future__ import annotations

from pathlib import Path

from xdist_groups import LONGEST_FIRST, SHARED_BY_WORKER

ROOT = Path(__file__).resolve().parents[1]


def test_the_longest_groups_are_groups_of_this_suite() -> None:
    shared = {group for _, group in SHARED_BY_WORKER}
    unknown = [group for group in LONGEST_FIRST if group not in shared and not (ROOT / group).is_file()]
    assert not unknown, f"LONGEST_FIRST names no shared group and no test file: {unknown}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
