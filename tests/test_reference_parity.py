"""Every NodeSet and SlurmCluster value the reference install sends has a row in docs/infra.md's parity tables.

The reference is nebius/nebius-solutions-library's soperator/modules/slurm/templates/helm_values/
flux_release_nodesets.yaml.tftpl (the NodeSets, helm-nodesets ``nodesets[]``) and terraform_fluxcd_values.yaml.tftpl
(the soperator-fluxcd values; their ``slurmCluster.overrideValues`` are helm-slurm-cluster's) at commit
37723db758e28088d8e1dc5f8c2ad04a6fbe150e, read from the pinned upstream folder (tests/upstream_files.py:
``../shared/upstream/reference/``, or ``FT_UPSTREAM``). Of that file's 13 stored revisions this is the one whose values
match Soperator 4.1.7: it mounts the ConfigMap ``slurm-scripts``, the name helm/slurm-cluster 4.1.7 gives it
(templates/slurm-scripts-cm.yaml:5); a later revision (ecc5cec6) mounts ``${cluster_name}-slurm-scripts``, 5.0's name.

Their keys are read from the YAML lines of the templates (Terraform directives skipped), as paths under
``nodesets[]`` and under ``slurmCluster.overrideValues`` of the values document the second one holds; a table row
covers a path when one of the row's backticked paths is a prefix of it.
"""

from __future__ import annotations

import re
from pathlib import Path

from upstream_files import upstream_file

REPO = Path(__file__).resolve().parents[1]
REFERENCE = "reference/nebius-solutions-library-37723db7/soperator/modules/slurm/templates/helm_values"
TEMPLATE = f"{REFERENCE}/flux_release_nodesets.yaml.tftpl"
FLUX_VALUES = f"{REFERENCE}/terraform_fluxcd_values.yaml.tftpl"
DOC = REPO / "docs/infra.md"
TABLE_INTRO = "NodeSet values (`helm-nodesets` `nodesets[]`):"
CLUSTER_TABLE_INTRO = "SlurmCluster values (`helm-slurm-cluster`, the reference's `slurmCluster.overrideValues`):"
ITEM = ("nodesets", "overrideValues", "nodesets", "[]")
CLUSTER = ("slurmCluster", "overrideValues")
VALUES_DOCUMENT = "      values.yaml: |"
"""The line of terraform_fluxcd_values.yaml.tftpl whose literal block is the values document."""
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


def leaves_under(text: str, prefix: KeyPath) -> set[KeyPath]:
    """The leaf keys under ``prefix``, list markers dropped (``slurmd.volumes.customVolumeMounts.name``)."""
    under = [p[len(prefix):] for p in template_keys(text) if p[:len(prefix)] == prefix and len(p) > len(prefix)]
    leaves = {p for p in under if not any(q[:len(p)] == p and q != p for q in under)}
    return {tuple(s for s in p if s != "[]") for p in leaves}


def nodeset_leaves(text: str) -> set[KeyPath]:
    return leaves_under(text, ITEM)


def cluster_leaves(text: str) -> set[KeyPath]:
    """The SlurmCluster values: the ConfigMap's values.yaml block, read as its own document."""
    lines = text.splitlines()
    return leaves_under("\n".join(lines[lines.index(VALUES_DOCUMENT) + 1:]), CLUSTER)


def table_paths(doc: str, intro: str = TABLE_INTRO) -> list[KeyPath]:
    """The backticked paths of the first cell of each row of the parity table after ``intro``."""
    lines = doc.splitlines()
    start = lines.index(intro)
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
    leaves = nodeset_leaves(upstream_file(TEMPLATE).read_text())
    # values the issue names, each a leaf the reference sends
    for path in ("nodeConfig.static", "enableHostUserNamespace", "slurmd.volumes.customVolumeMounts.mountPath",
                 "customInitContainers.command", "tolerations.effect", "configMapRefSupervisord"):
        assert tuple(path.split(".")) in leaves, path
    assert len(leaves) == 67


def test_every_reference_nodeset_value_has_a_row_in_the_parity_table() -> None:
    rows = table_paths(DOC.read_text())
    assert ("nodeConfig", "static") in rows
    assert uncovered(nodeset_leaves(upstream_file(TEMPLATE).read_text()), rows) == []


def test_a_value_missing_from_the_table_is_named() -> None:
    leaves = nodeset_leaves(upstream_file(TEMPLATE).read_text())
    rows = [r for r in table_paths(DOC.read_text()) if r != ("enableHostUserNamespace",)]
    assert uncovered(leaves, rows) == ["enableHostUserNamespace"]


def test_every_reference_slurm_cluster_value_has_a_row_in_the_parity_table() -> None:
    leaves = cluster_leaves(upstream_file(FLUX_VALUES).read_text())
    for path in ("partitionConfiguration.configType", "populateJail.k8sNodeFilterName",
                 "slurmNodes.login.customInitContainers.name", "sConfigController.node.size"):
        assert tuple(path.split(".")) in leaves, path
    assert ("helmRepository",) not in {leaf[:1] for leaf in leaves}  # only the slurmCluster release's values
    assert uncovered(leaves, table_paths(DOC.read_text(), CLUSTER_TABLE_INTRO)) == []
