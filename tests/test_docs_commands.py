"""The commands of README.md and docs/*.md as a new user types them (issue 55, issue 54 item 1).

Every `bash` block of a page either runs here exactly as written, or is marked as needing a cloud account, a GPU or
values of the reader's own, or as the test suite itself (tests/docs_blocks.py). A page's runnable blocks run in
order in one new shell (no venv on PATH, no SLURM_CONF), so a block that needs a setup line only works when the page
gives it first; the Slurm jobs they submit must end COMPLETED. The README goes first (`make demo`: the later pages'
local-stack commands find its outputs, as a reader who followed the README does); the blocks that drive the
rehearsal cluster run on the tests' cluster, the one they address, and the README's pipeline there is the run the
cluster pipeline tests check (tests/documented_cluster_run.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_fixtures import START, Cluster
from docs_blocks import CONVENTION, MARKERS, PAGES, ROOT, Block, command_lines, read_blocks
from docs_shell import assert_ran, new_shell_env, page_blocks, run_in_new_shell
from documented_cluster_run import README, DocumentedClusterRun
from slurm_jobs import job_field

from documents.evaluator_report import read_evaluator_report
from documents.metrics import read_metrics
from documents.run_config import load_run_config
from documents.run_manifest import read_run_manifest
from documents.run_plan import read_run_plan
from documents.run_record import RunIndex
from infra.pipeline.chain import job_plan
from infra.runs.store import list_runs, local_store, read_run_file

SUBMITTED = re.compile(r"^Submitted batch job (\d+)$", re.MULTILINE)
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}
ALL_BLOCKS = [block for page in PAGES for block in read_blocks(page)]


def wait_for_jobs(output: str, slurm_conf: Path, timeout: float = 1800) -> dict[str, str]:
    """Each job the blocks submitted (sbatch's `Submitted batch job N`), waited until it ends: its end state."""
    states = {}
    for job in SUBMITTED.findall(output):
        deadline = time.monotonic() + timeout
        while (state := job_field(job, "JobState", slurm_conf)) not in ENDED and time.monotonic() < deadline:
            time.sleep(1)
        states[job] = state or "unknown (no longer known to scontrol)"
    return states


# --- the marks -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang == "bash"], ids=lambda b: b.where)
def test_a_command_block_is_run_or_marked_with_a_known_mark(block: Block) -> None:
    assert block.marker is None or block.marker in MARKERS, (
        f"{block.where}: unknown mark {block.marker!r}; the marks are {sorted(MARKERS)}")


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang != "bash"], ids=lambda b: b.where)
def test_commands_are_not_hidden_in_other_blocks(block: Block) -> None:
    """A command shown in an output or listing block would escape both the run and the marks."""
    assert not command_lines(block.text), (
        f"{block.where}: a {block.lang or 'plain'} block holds commands {command_lines(block.text)}: put them in a "
        "```bash block (run by this test, or marked), and show the output in a block of its own")


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang == "bash" for b in read_blocks(p))],
                         ids=lambda p: p.name)
def test_each_page_says_how_its_commands_run(page: Path) -> None:
    """The intro (before the first section heading) names this test and the marks the page uses."""
    intro = page.read_text().split("\n## ", 1)[0]
    assert CONVENTION in intro, f"{page.name}: the intro does not say its blocks run in {CONVENTION}"
    for marker in {b.marker for b in read_blocks(page) if b.marker}:
        assert marker in intro, f"{page.name}: the intro does not explain the mark {marker}"


def test_the_test_suite_block_is_what_ci_runs() -> None:
    """`make test` cannot run inside the suite it starts: CI's entry point runs exactly it, and make's target runs
    pytest over tests/ (this file among them); a block marked as the suite runs `make test` or pytest on test files
    that exist."""
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test"
    assert re.search(r"^test: .*\n\t\$\(VENV\)/bin/pytest\b", (ROOT / "Makefile").read_text(), re.MULTILINE)
    suite = [b for b in ALL_BLOCKS if b.need == "suite"]
    assert suite, "no block is marked as the test suite itself"
    for block in suite:
        command = " ".join(block.text.replace("\\\n", " ").split("#", 1)[0].split())
        if command != "make test":
            assert command.startswith(".venv/bin/pytest "), f"{block.where}: {command}"
            for pattern in command.split()[1:]:
                assert sorted(ROOT.glob(pattern)), f"{block.where}: {pattern} names no test file"


# --- the runs --------------------------------------------------------------------------------------------------

LOCAL_PAGES = [p for p in PAGES if page_blocks(p, cluster=False)]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("page", LOCAL_PAGES, ids=lambda p: p.name)
def test_page_commands_run_as_written(page: Path, slurm: str) -> None:
    """The page's blocks in one new shell, in order, and every Slurm job they submitted COMPLETED."""
    proc = run_in_new_shell(page_blocks(page, cluster=False), timeout=3600)
    assert_ran(proc, page.name)
    states = wait_for_jobs(proc.stdout, Path(slurm))
    logs = {job: ROOT / f"slurm-{job}.out" for job in states}  # sbatch's default log, in the submit directory
    failed = {job: state for job, state in states.items() if state != "COMPLETED"}
    assert not failed, f"{page.name}: jobs ended {failed}\n" + "\n".join(
        f"{logs[job]}:\n{logs[job].read_text(errors='replace')[-2000:]}" for job in failed if logs[job].is_file())
    for log in logs.values():
        log.unlink(missing_ok=True)
    if page.name == "README.md":
        stored = the_demo_run_stored_and_reported()
        again = subprocess.run(["make", "demo"], cwd=ROOT, env=new_shell_env(), capture_output=True, text=True,
                               timeout=900)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "submitted job" not in again.stderr, f"a second make demo submitted:\n{again.stderr[-3000:]}"
        assert the_demo_run_stored_and_reported() == stored, "an unchanged demo is stored once, with the same results"


def the_demo_run_stored_and_reported() -> RunIndex:
    """`make demo`'s run as the README says it ends: the four stages COMPLETED in the stack's outputs, which carry
    the evaluation's figures; the run stored once under .local/artifacts with its config, training metrics,
    manifest, loss chart, evaluator report and chart, outputs and adapter; the manifest and metrics those of the
    run config's training (workloads/configs/local.json: steps, processes, logging). Returns the stored run."""
    outputs = json.loads((ROOT / ".local/pipeline/local-outputs.json").read_text())
    stages = ["prepare", "readiness", "train", "eval"]
    assert outputs["pipeline_stages"] == stages
    assert {outputs[f"pipeline_{stage}_state"] for stage in stages} == {"COMPLETED"}
    assert all(isinstance(outputs[f"pipeline_{stage}_elapsed_s"], int) for stage in stages)
    job_ids = {stage: outputs[f"pipeline_{stage}_job_id"] for stage in stages}
    store = local_store(ROOT)
    [stored] = [run for run in list_runs(store, "local") if run.job_ids == job_ids]
    report_name = f"eval/evaluator_{job_ids['eval']}.json"
    assert set(stored.files) == {"config/local.json", "train/metrics.jsonl", "train/run_manifest.json",
                                 "train/loss.png", report_name, report_name.replace(".json", ".png"), "outputs.json",
                                 "adapter/adapter_config.json", "adapter/adapter_model.safetensors"}
    evaluation = read_evaluator_report(read_run_file(store, "local", stored.run_id, report_name), report_name)
    assert evaluation.job_id == job_ids["eval"] and evaluation.finetuned_kind == "merged"
    assert outputs["eval_perplexity_base"] == evaluation.base_model.perplexity == stored.perplexity_base
    assert outputs["eval_tokens_per_second_finetuned"] == evaluation.finetuned_model.tokens_per_second > 0
    assert json.loads(read_run_file(store, "local", stored.run_id, "outputs.json")) == outputs

    train = load_run_config(ROOT / "workloads/configs/local.json").train
    manifest = read_run_manifest(read_run_file(store, "local", stored.run_id, "train/run_manifest.json"), "manifest")
    assert manifest.status == "completed" and manifest.global_step == train.max_steps
    assert manifest.world_size == train.procs_per_node
    planned = subprocess.run([str(ROOT / ".venv/bin/ftstack"), "plan", "--stack", "local", "--json"], cwd=ROOT,
                             capture_output=True, text=True, timeout=600, check=True)
    printed = read_run_plan(json.dumps(json.loads(planned.stdout)["run_plan"]), "ftstack plan --stack local --json")
    assert manifest.plan == job_plan(printed), "the run trained with the plan `ftstack plan` prints (its estimate aside)"
    records = read_metrics(read_run_file(store, "local", stored.run_id, "train/metrics.jsonl"), "metrics")
    losses = [r for r in records if r.loss is not None]
    assert [r.step for r in losses] == list(range(train.logging_steps, train.max_steps + 1, train.logging_steps))
    assert stored.train_loss_final == losses[-1].loss
    assert (ROOT / ".local/work/outputs/local/merged/model.safetensors").is_file()
    return stored


@pytest.mark.cluster
@pytest.mark.slow
def test_readme_rehearsal_cluster_commands_run_as_written(documented_cluster_run: DocumentedClusterRun) -> None:
    """The README's rehearsal-cluster blocks (start, the pipeline, its runs) are the session's documented run on the
    tests' cluster (tests/documented_cluster_run.py), which the cluster pipeline tests check: its jobs COMPLETED."""
    states = {stage: entry["outs"]["state"] for stage, entry in documented_cluster_run.state["stages"].items()}
    assert set(states.values()) == {"COMPLETED"}, states


OTHER_CLUSTER_PAGES = [p for p in PAGES if p != README and page_blocks(p, cluster=True)]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("page", OTHER_CLUSTER_PAGES, ids=lambda p: p.name)
def test_rehearsal_cluster_commands_run_as_written(page: Path, documented_cluster: Cluster) -> None:
    """A later page's rehearsal-cluster blocks in one new shell, on the tests' cluster: the one the pages' commands
    address (stacks/Pulumi.cluster.yaml's login host and jail, the default .local/cluster). A page that stops the
    cluster (docs/pipeline.md loses a node, starts it again, stops) leaves it started again as the tests start it."""
    try:
        assert_ran(run_in_new_shell(page_blocks(page, cluster=True), timeout=3600), page.name)
    finally:
        restarted = documented_cluster.script("start", *START, timeout=900)
    assert restarted.returncode == 0, restarted.stderr[-3000:]


def test_plan_json_keys_and_policy_count_are_the_pages() -> None:
    """docs/cost-and-policies.md lists the keys of `ftstack plan --json` and the number of policy results: both
    read from the command's own output."""
    page = (ROOT / "docs/cost-and-policies.md").read_text()
    proc = subprocess.run([str(Path(sys.executable).with_name("ftstack")), "plan", "--stack", "demo", "--policies",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    document = json.loads(proc.stdout)
    listed = re.search(r"--policies --json +# \{([^}]*)\}", page)
    assert listed, "the --json line lists no keys"
    assert [k.strip().strip('"') for k in listed.group(1).split(",")] == list(document)
    counted = re.search(r"--policies +#.*?(\d+) policy results", page)
    assert counted and int(counted.group(1)) == len(document["policies"])
