"""Values a chart never reads, found from the render itself: a value whose change leaves every rendered object
unchanged is unread (a misspelled or retired key, a key of another chart version; Helm passes it silently).

Two passes per release, both with the real Helm (infra/soperator/helm_render.py). First every string and number of
the values is marked at once (``<value>-zq<n>x``, or a number of its own); each mark found in the output is a value
read (a render the marks break is split in halves). Then each remaining value (booleans, and values the chart
transforms before printing) is changed alone: a manifest unchanged but for the lines that differ between two
renders of the same values (certificates a chart generates) means unread; a render error means the chart reacted.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.soperator.helm_render import HelmRelease, HelmRenderError, render_manifest
from infra.soperator.manifest_checks import dotted

Path_ = tuple[str | int, ...]
MARK_BASE = 7_300_000


def leaves(values: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """(path, value) of every scalar of a values document; dict keys and list indexes in the path."""
    if isinstance(values, Mapping):
        for key, value in values.items():
            yield from leaves(value, (*path, key))
    elif isinstance(values, list):
        for index, value in enumerate(values):
            yield from leaves(value, (*path, index))
    elif path:
        yield path, values


def with_changes(values: Mapping[str, Any], changes: Mapping[Path_, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(values))
    for path, value in changes.items():
        node: Any = out
        for segment in path[:-1]:
            node = node[segment]
        node[path[-1]] = value
    return out


def mark(value: Any, index: int) -> tuple[Any, str] | None:
    """A marked copy of a string or number and the text that shows it was printed; None for other values."""
    if isinstance(value, str):
        return f"{value}-zq{index}x", f"zq{index}x"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return MARK_BASE + index, str(MARK_BASE + index)
    return None


def changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if value is None:
        return "x"
    marked = mark(value, 0)
    return marked[0] if marked else value


class _Renderer:
    """One release's manifest with some of its values changed."""

    def __init__(self, release: HelmRelease, mirror: Path | None, kube_version: str, api_versions: Iterable[str]):
        self.release, self.mirror, self.kube_version = release, mirror, kube_version
        self.api_versions = tuple(api_versions)

    def manifest(self, changes: Mapping[Path_, Any]) -> str:
        values = with_changes(self.release.values, changes) if changes else self.release.values
        return render_manifest(dataclasses.replace(self.release, values=values), mirror=self.mirror,
                               kube_version=self.kube_version, api_versions=self.api_versions)

    def unchanged(self, path: Path_, value: Any) -> bool:
        """Whether changing one value leaves the manifest as it was but for what the chart generates anew on every
        render (a render error: the chart reacted)."""
        try:
            other = self.manifest({path: value}).splitlines()
        except HelmRenderError:
            return False
        base = self.base_lines
        return len(other) == len(base) and {i for i, (a, b) in enumerate(zip(base, other)) if a != b} <= self.noise

    @functools.cached_property
    def base_lines(self) -> list[str]:
        """The manifest of the release's own values, by line."""
        return self.manifest({}).splitlines()

    @functools.cached_property
    def noise(self) -> frozenset[int]:
        """Lines of the manifest that differ between two renders of the same values (generated certificates)."""
        again = render_manifest(self.release, mirror=self.mirror, kube_version=self.kube_version,
                                api_versions=self.api_versions, fresh=True).splitlines()
        return frozenset(i for i, (a, b) in enumerate(zip(self.base_lines, again)) if a != b)


def _marked_read(renderer: _Renderer, marks: Sequence[tuple[Path_, Any, str]]) -> set[Path_]:
    """The paths whose mark the output shows, all marks rendered at once (halves where the marks break the render)."""
    if not marks:
        return set()
    try:
        text = renderer.manifest({path: marked for path, marked, _ in marks})
    except HelmRenderError:
        if len(marks) == 1:
            return set()
        half = len(marks) // 2
        return _marked_read(renderer, marks[:half]) | _marked_read(renderer, marks[half:])
    return {path for path, _, shown in marks if shown in text}


def unread_values(release: HelmRelease, *, mirror: Path | None, kube_version: str, api_versions: Iterable[str] = (),
                  only: Iterable[str] | None = None) -> list[str]:
    """The dotted paths of ``release.values`` the chart never reads (the deletion documents are not values); ``only``
    limits the question to some dotted paths."""
    renderer = _Renderer(release, mirror, kube_version, api_versions)
    asked = None if only is None else set(only)
    paths = [(p, v) for p, v in leaves(release.values) if asked is None or dotted(p) in asked]
    marks = [(path, *marked) for index, (path, value) in enumerate(paths, start=1)
             if (marked := mark(value, index)) is not None]
    read = _marked_read(renderer, marks)
    return [dotted(path) for path, value in paths if path not in read and renderer.unchanged(path, changed(value))]
