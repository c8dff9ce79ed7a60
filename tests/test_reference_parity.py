"""Every NodeSet value the reference install sends has a row in docs/infra.md's parity table.

The reference is a pinned copy of the solutions library's flux_release_nodesets.yaml.tftpl (tests/data/reference/,
commit in its README). Its keys are read from the YAML lines of the template (Terraform directives skipped), as
paths under ``nodesets[]``; a table row covers a path when one of the row's backticked paths is a prefix of it.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "tests/data/reference/flux_release_nodesets.yaml.tftpl"
DOC = REPO / "docs/infra.md"
TABLE_INTRO = "NodeSet values (`helm-nodesets` `nodesets[]`):"
ITEM = ("nodesets", "overrideValues", "nodesets", "[]")
KEY = re.compile(r'^(?P<indent>\s*)(?P<dash>- )?(?P<key>[A-Za-z_][\w./-]*|"[^"]+"):(?:\s|$)')

KeyPath = tuple[str, ...]


def template_keys(text: str) -> list[KeyPath]:
    """Every mapping key of a YAML template as its path from the root; ``[]`` marks a list item."""
    stack: list[tuple[str, int]] = []
    paths: list[KeyPath] = []
    block: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("%{"):
            continue
        indent = len(line) - len(line.lstrip())
        if block is not None and indent > block:
            continue  # inside a literal block scalar
        block = indent if line.rstrip().endswith("|") else None
        match = KEY.match(line)
        if match is None:
            continue
        column = len(match["indent"])
        if match["dash"]:
            while stack and stack[-1][1] >= column:
                stack.pop()
            stack.append(("[]", column))
            column += 2
        while stack and stack[-1][1] >= column:
            stack.pop()
        stack.append((match["key"].strip('"'), column))
        paths.append(tuple(segment for segment, _ in stack))
    return paths


def nodeset_leaves(text: str) -> set[KeyPath]:
    """The leaf keys under ``nodesets[]``, list markers dropped (``slurmd.volumes.customVolumeMounts.name``)."""
    under = [p[len(ITEM):] for p in template_keys(text) if p[:len(ITEM)] == ITEM and len(p) > len(ITEM)]
    leaves = {p for p in under if not any(q[:len(p)] == p and q != p for q in under)}
    return {tuple(s for s in p if s != "[]") for p in leaves}


def table_paths(doc: str) -> list[KeyPath]:
    """The backticked paths of the first cell of each row of the NodeSet parity table."""
    lines = doc.splitlines()
    start = lines.index(TABLE_INTRO)
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            if rows:
                break
            continue
        cells = line.split("|")
        if len(cells) < 3 or set(cells[1].strip()) <= {"-", " "}:
            continue
        rows += [tuple(p.split(".")) for p in re.findall(r"`([^`]+)`", cells[1])]
    return rows


def uncovered(leaves: set[KeyPath], rows: list[KeyPath]) -> list[str]:
    return sorted(".".join(leaf) for leaf in leaves if not any(leaf[:len(row)] == row for row in rows))


def test_template_keys_follow_indentation_lists_and_skip_directives() -> None:
    text = ("a:\n  %{~ if x ~}\n  b:\n    - name: n\n      c: |\n        d: not a key\n      e: 1\n  f: 2\n")
    assert template_keys(text) == [("a",), ("a", "b"), ("a", "b", "[]", "name"), ("a", "b", "[]", "c"),
                                   ("a", "b", "[]", "e"), ("a", "f")]


def test_the_pinned_template_is_read_whole() -> None:
    leaves = nodeset_leaves(TEMPLATE.read_text())
    # values the issue names, each a leaf the reference sends
    for path in ("nodeConfig.static", "enableHostUserNamespace", "slurmd.volumes.customVolumeMounts.mountPath",
                 "customInitContainers.command", "tolerations.effect", "configMapRefSupervisord"):
        assert tuple(path.split(".")) in leaves, path
    assert len(leaves) == 67


def test_every_reference_nodeset_value_has_a_row_in_the_parity_table() -> None:
    rows = table_paths(DOC.read_text())
    assert ("nodeConfig", "static") in rows
    assert uncovered(nodeset_leaves(TEMPLATE.read_text()), rows) == []


def test_a_value_missing_from_the_table_is_named() -> None:
    leaves = nodeset_leaves(TEMPLATE.read_text())
    rows = [r for r in table_paths(DOC.read_text()) if r != ("enableHostUserNamespace",)]
    assert uncovered(leaves, rows) == ["enableHostUserNamespace"]
