"""Every Helm value the program emits, for every cloud stack, is in the chart contract of the pinned version
(infra/soperator/charts/*.yaml, written from the charts at their tags); values the charts drop or the CRDs prune fail."""

from __future__ import annotations

import copy

import pytest

from documents.chart_contract import read_contract_file
from infra.config import load_stack_config
from infra.nebius.layout import layout
from infra.soperator import chart_contract
from infra.soperator.chart_contract import ContractError, contract, violations
from infra.soperator.values import BackupTarget, release_plan

CLOUD_STACKS = ("dev", "demo", "h100")
SIZES = {"jail": 256, "controller-spool": 128, "accounting": 256}


def plan(stack: str, version: str | None = None):
    cfg = load_stack_config(stack)
    if version is not None:
        assert cfg.soperator
        # the active checks are described for 4.1.7 only (infra/soperator/active_checks.py); 5.0.0 renamed them
        off = cfg.soperator.active_checks.model_copy(update={"scope": "off"})
        cfg = cfg.model_copy(update={"soperator": cfg.soperator.model_copy(update={"version": version, "active_checks": off})})
    specs = layout(cfg)
    sizes = SIZES | {fs.mount_tag: fs.size_gib for fs in specs.filesystems}
    backup = BackupTarget("bucket", "https://storage.eu-north1.nebius.cloud") if cfg.buckets and cfg.buckets.backups.enabled else None
    return {r.key: r for r in release_plan(cfg, list(specs.node_groups), "alloc", sizes, backup)}


@pytest.mark.parametrize("stack", CLOUD_STACKS)
@pytest.mark.parametrize("version", [None, "5.0.0"])
def test_every_emitted_value_is_in_the_contract_of_the_pinned_version(stack, version) -> None:
    releases = plan(stack, version)
    assert {"kruise", "slurm-cluster", "nodesets"} <= set(releases)
    for release in releases.values():
        assert release.violations() == [], release.key


def _bad(release, change) -> list[str]:
    values = copy.deepcopy(release.values)
    change(values)
    family, chart = release.contract
    return violations(contract(family, release.version, chart), values)


def test_the_findings_of_issue_12_are_contract_violations() -> None:
    demo = plan("demo")
    cluster, nodesets, kruise = demo["slurm-cluster"], demo["nodesets"], demo["kruise"]
    assert _bad(cluster, lambda v: v["slurmNodes"]["controller"].update(size=2)) == [
        "slurm-cluster 4.1.7: slurmNodes.controller.size is not a value the chart reads or its CRD keeps"]
    spool = {"volumeClaimTemplateSpec": {"storageClassName": "x", "resources": {"requests": {"storage": "128Gi"}}}}
    found = _bad(nodesets, lambda v: v["nodesets"][0]["slurmd"]["volumes"].update(spool=spool))
    assert found and all("slurmd.volumes.spool.volumeClaimTemplateSpec" in f for f in found)
    assert _bad(cluster, lambda v: v["slurmNodes"]["accounting"]["mariadbOperator"].pop("storage")) == [
        "slurm-cluster 4.1.7: slurmNodes.accounting.mariadbOperator.storage is required (spec.slurmNodes.accounting."
        "mariadbOperator.storage (copied into the MariaDB CR; the chart default {} is rejected by mariadb-operator's "
        "webhook))"]
    assert _bad(kruise, lambda v: v.pop("installation"))[0].startswith(
        "kruise 1.8.0: installation.createNamespace is required")
    assert _bad(cluster, lambda v: v["slurmNodes"]["controller"]["volumes"]["spool"].update(
        volumeClaimTemplateSpec={"x": 1})) == [
        "slurm-cluster 4.1.7: slurmNodes.controller.volumes.spool.volumeClaimTemplateSpec.x is not a value the "
        "chart reads or its CRD keeps"]


def test_5_0_nodesets_need_the_cluster_name() -> None:
    nodesets = plan("demo", "5.0.0")["nodesets"]
    assert nodesets.values["clusterName"] == "soperator"
    assert _bad(nodesets, lambda v: v.pop("clusterName")) == [
        "nodesets 5.0.0: clusterName is required (spec.clusterName)"]
    assert _bad(plan("demo")["nodesets"], lambda v: v.update(clusterName="x")) == [
        "nodesets 4.1.7: clusterName is not a value the chart reads or its CRD keeps"]


def test_versions_are_data_and_a_new_release_shows_what_changed() -> None:
    assert {"4.1.7", "5.0.0"} <= set(chart_contract.versions("soperator"))
    assert chart_contract.changes("soperator", "4.1.7", "5.0.0") == {"nodesets": {"added": ["clusterName"], "removed": []}}
    with pytest.raises(ContractError, match="no chart contract for soperator 9.9.9"):
        contract("soperator", "9.9.9", "nodesets")


def test_subtree_and_schema_rules() -> None:
    c = contract("soperator", "4.1.7", "nodesets")
    ok = {"nodesets": [{"affinity": {"anything": {"deep": 1}}, "slurmd": {"volumes": {"spool": {"emptyDir": {}}}}}]}
    assert violations(c, ok) == []
    bad = {"nodesets": [{"slurmd": {"volumes": {"spool": {"hostPathX": {}}}}}]}
    assert violations(c, bad) == [
        "nodesets 4.1.7: nodesets.[].slurmd.volumes.spool.hostPathX is not a value the chart reads or its CRD keeps"]


def test_a_malformed_contract_file_names_the_file_and_the_field(tmp_path) -> None:
    typo = tmp_path / "soperator-9.0.0.yaml"
    typo.write_text("version: 9.0.0\nsource: x\ncharts:\n  nodesets:\n    keys:\n      - {path: a.b, land: spec.a}\n")
    with pytest.raises(ContractError, match=r"soperator-9\.0\.0\.yaml: not a valid chart contract "
                                            r"\(charts\.nodesets\.keys\.0\.lands: Field required; "
                                            r"charts\.nodesets\.keys\.0\.land: Extra inputs"):
        read_contract_file(typo)
    mixed = tmp_path / "soperator-9.0.1.yaml"
    mixed.write_text("version: 9.0.1\nsource: x\nextends: 4.1.7\ncharts:\n  nodesets:\n    keys: []\n")
    with pytest.raises(ContractError, match=r"charts\.nodesets: a file that extends 4\.1\.7 lists 'add'/'remove'"):
        read_contract_file(mixed)
    every = [read_contract_file(path) for path in sorted(chart_contract.CHARTS_DIR.glob("*.yaml"))]
    assert {(f.version, f.extends) for f in every} >= {("4.1.7", None), ("5.0.0", "4.1.7")}


@pytest.mark.parametrize(("stack", "size"), [("demo", 5), ("h100", 2)])
def test_ephemeral_workers_reach_the_nodeset_and_slurm_config(stack, size) -> None:
    """helm/nodesets 4.1.7 (templates/nodeset.yaml:22-40): replicas is every node the set may power up, ephemeralNodes
    true, initialNumberEphemeralNodes rendered whenever the key is given (0 included); the SlurmCluster's
    slurmConfig.suspendTime (operator default 1000000000, i.e. never) is what powers idle workers down."""
    releases = plan(stack)
    nodeset, housekeeping = releases["nodesets"].values["nodesets"]
    assert housekeeping["name"] == "housekeeping" and "ephemeralNodes" not in housekeeping
    assert (nodeset["replicas"], nodeset["ephemeralNodes"], nodeset["initialNumberEphemeralNodes"]) == (size, True, 0)
    assert "ephemeralTopologyWaitTimeout" not in nodeset
    assert releases["slurm-cluster"].values["slurmConfig"] == {"suspendTime": 600}
    assert _bad(releases["nodesets"], lambda v: v["nodesets"][0].update(ephemeral=True)) == [
        "nodesets 4.1.7: nodesets.[].ephemeral is not a value the chart reads or its CRD keeps"]
    assert _bad(releases["slurm-cluster"], lambda v: v["slurmConfig"].update(suspendTimeout=90)) == [
        "slurm-cluster 4.1.7: slurmConfig.suspendTimeout is not a value the chart reads or its CRD keeps"]


def test_always_on_workers_send_no_ephemeral_keys() -> None:
    """The chart renders initialNumberEphemeralNodes whenever the key exists, ephemeral or not: a fixed worker set
    sends none of the three keys, and no suspendTime."""
    cfg = load_stack_config("dev")
    assert cfg.nodes and not any(w.ephemeral for w in cfg.nodes.workers)
    releases = plan("dev")
    for nodeset in releases["nodesets"].values["nodesets"]:
        assert not {"ephemeralNodes", "initialNumberEphemeralNodes", "ephemeralTopologyWaitTimeout"} & set(nodeset)
    assert "slurmConfig" not in releases["slurm-cluster"].values
