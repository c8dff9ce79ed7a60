"""The commands of README.md and docs/*.md as a new user types them (issue 55, issue 54 item 1).

Every `bash` block of a page either runs here exactly as written, or is marked as needing a cloud account, a GPU or
values of the reader's own, or as the test suite itself (tests/docs_blocks.py). A page's runnable blocks run in
order in one new shell (no venv on PATH, no SLURM_CONF), so a block that needs a setup line only works when the page
gives it first; the Slurm jobs they submit must end COMPLETED. The README goes first (`make demo`: the later pages'
local-stack commands find its outputs, as a reader who followed the README does); the blocks that drive the
rehearsal cluster run beside the cluster tests, on their worker.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_fixtures import DEFAULT_IDENTITIES
from docs_blocks import CONVENTION, MARKERS, PAGES, ROOT, Block, command_lines, read_blocks
from slurm_jobs import job_field

from documents.evaluator_report import read_evaluator_report
from documents.metrics import read_metrics
from documents.run_config import load_run_config
from documents.run_manifest import read_run_manifest
from documents.run_plan import read_run_plan
from documents.run_record import RunIndex
from infra.config import load_stack_config
from infra.environment.lock import TARGETS
from infra.environment.source import wheelhouse
from infra.pipeline.chain import job_plan
from infra.pipeline.environment_source import WHEELHOUSE_CACHE
from infra.runs.store import list_runs, local_store, read_run_file

SUBMITTED = re.compile(r"^Submitted batch job (\d+)$", re.MULTILINE)
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}
ALL_BLOCKS = [block for page in PAGES for block in read_blocks(page)]


SET_BY_TESTS = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "SLURM_CONF", "FT_", "SLURM_", "PYTEST_", "HF_",
                "LOCAL_CLUSTER_", "FTSTACK_", "PULUMI_")


def new_shell_env() -> dict[str, str]:
    """This machine's environment as a new login shell has it (its certificates and package mirrors included),
    less what a test, pytest or an activated venv set: the venv off PATH, no SLURM_CONF, VIRTUAL_ENV, PYTHONPATH,
    FT_*. The workers' one-thread cap (tests/conftest.py) stays: it is not the reader's, but keeps the suite's CPU
    where it was."""
    venv_bin = Path(sys.executable).parent.resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith(SET_BY_TESTS)}
    env["PATH"] = ":".join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":")
                           if p and Path(p).resolve() != venv_bin)
    return env


def server_address(block: Block) -> tuple[str, str]:
    """The loopback address a server block's comment names (`# 127.0.0.1:8000`)."""
    found = re.findall(r"(127\.0\.0\.1):(\d+)", block.text.split(" # ", 1)[-1] if " # " in block.text else "")
    assert found, f"{block.where}: a block that runs until stopped names no 127.0.0.1:PORT in its comment"
    return found[-1]


def server_script(block: Block) -> str:
    """Start the server block in a session of its own and wait until its address accepts a connection (failing if
    it exits first, or if the address is taken before it starts). It keeps running, as in the reader's other
    terminal, for the page's later blocks (the chat UI needs the server); the page's end stops it (SIGTERM)."""
    host, port = server_address(block)
    probe = f"(exec 3<>/dev/tcp/{host}/{port}) 2>/dev/null"
    return (f"if {probe}; then echo '{host}:{port} is taken before {block.where} starts' >&2; exit 1; fi\n"
            f"setsid bash -c {shlex.quote(block.text)} &\nservers=\"$! $servers\"\n"
            f"for _ in $(seq 900); do {probe} && break; "
            f"kill -0 $! 2>/dev/null || {{ echo '{block.where} exited before listening' >&2; exit 1; }}; "
            f"sleep 1; done\n"
            f"{probe} || {{ echo '{block.where}: nothing on {host}:{port}' >&2; exit 1; }}\n")


STOP_SERVERS = "for s in $servers; do kill -TERM -- -$s 2>/dev/null; done; wait"


def run_in_new_shell(blocks: list[Block], timeout: float, *, enter: tuple[str, ...] = (), setup: str = "",
                     on_exit: str = "") -> subprocess.CompletedProcess[str]:
    """The blocks one after another in one `bash`, from the repository root; stops at the first failing command
    (each block's start is echoed to standard error, so a failure names its block). A server block is started and
    reached (`server_script`); the servers stop when the page ends. `enter` prefixes the bash command line (a
    namespace to run in), `setup` runs before the blocks, `on_exit` after them, whatever their end."""
    at_exit = "; ".join(filter(None, (STOP_SERVERS, on_exit)))
    script = f"set -eo pipefail\nservers=''\ntrap {shlex.quote(at_exit)} EXIT\n{setup}" + "".join(
        f"echo '>>> {b.where}' >&2\n" + (server_script(b) if b.need == "server" else f"{b.text}\n") for b in blocks)
    return subprocess.run([*enter, "bash", "-c", script], cwd=ROOT, env=new_shell_env(), capture_output=True,
                          text=True, timeout=timeout)


def assert_ran(proc: subprocess.CompletedProcess[str], what: str) -> None:
    started = re.findall(r"^>>> (\S+)$", proc.stderr, re.MULTILINE)
    assert proc.returncode == 0, (f"{what}: block {started[-1] if started else '?'} failed with exit code "
                                  f"{proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-4000:]}")


def wait_for_jobs(output: str, slurm_conf: Path, timeout: float = 1800) -> dict[str, str]:
    """Each job the blocks submitted (sbatch's `Submitted batch job N`), waited until it ends: its end state."""
    states = {}
    for job in SUBMITTED.findall(output):
        deadline = time.monotonic() + timeout
        while (state := job_field(job, "JobState", slurm_conf)) not in ENDED and time.monotonic() < deadline:
            time.sleep(1)
        states[job] = state or "unknown (no longer known to scontrol)"
    return states


def page_blocks(page: Path, cluster: bool) -> list[Block]:
    """The blocks a page runs here, in its order: unmarked ones and servers; those on the rehearsal cluster or
    the others."""
    return [b for b in read_blocks(page) if (b.runs or b.need == "server") and b.on_rehearsal_cluster == cluster]


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


def documented_cluster_shell(cluster_dir: Path) -> tuple[tuple[str, ...], str, str]:
    """What runs the pages' rehearsal-cluster blocks on a machine of their own: a new network namespace (the bridge
    and subnet the pages name are free there, whatever clusters this machine runs, and nothing but loopback and the
    cluster is reachable) and a private mount namespace in which `cluster_dir` is the default .local/cluster and
    /run/netns and /run/<prefix> are empty (the script's namespaces, jail mount point and their removal touch no
    other cluster's). Returns the command prefix, the setup lines and what stops the cluster however the page ends."""
    prefix = DEFAULT_IDENTITIES[0][0]
    for folder in (Path("/run/netns"), Path("/run") / prefix, ROOT / ".local" / "cluster"):
        folder.mkdir(parents=True, exist_ok=True)
    setup = (f"ip link set lo up\nmount -t tmpfs docs-netns /run/netns\nmount -t tmpfs docs-run /run/{prefix}\n"
             f"mount --bind {shlex.quote(str(cluster_dir))} {shlex.quote(str(ROOT / '.local' / 'cluster'))}\n")
    return ("unshare", "--net", "--mount", "--propagation", "private"), setup, "scripts/local-cluster.sh stop >&2"


def cluster_stack_wheelhouse() -> None:
    """The `cluster` stack's wheelhouse, built here before the pages run: the pip downloads behind it need this
    machine's route to the package index, which the pages' network namespace has not (a reader's machine has it)."""
    environment = load_stack_config("cluster", ROOT / "stacks").pipeline.environment
    assert environment.source == "wheelhouse", "the cluster stack ships a wheelhouse"
    wheelhouse(TARGETS[environment.lock], ROOT / WHEELHOUSE_CACHE)


@pytest.mark.cluster
@pytest.mark.slow
def test_rehearsal_cluster_commands_run_as_written(tmp_path: Path) -> None:
    """README's and docs/pipeline.md's rehearsal-cluster blocks, each page in its own new shell, on a cluster of
    their own at the default address they name (stacks/Pulumi.cluster.yaml's login host), made by the pages' own
    `start`: the tests' cluster and any other this machine runs are left alone (`documented_cluster_shell`)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        message = "the pages' cluster needs root and unshare (network and mount namespaces)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    cluster_stack_wheelhouse()
    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    enter, setup, stop = documented_cluster_shell(cluster_dir)
    try:
        for page in PAGES:
            blocks = page_blocks(page, cluster=True)
            if blocks:
                assert_ran(run_in_new_shell(blocks, timeout=3600, enter=enter, setup=setup, on_exit=stop), page.name)
    finally:
        shutil.rmtree(cluster_dir, ignore_errors=True)


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
