"""The stack's `pipeline.environment`: defaults per target, and what it refuses."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from infra.config import StackConfigError, load_stack_config, parse_stack_config

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBZXoof2CwLybfVERAHUrBsyLv4n0tOfk26uGtXZJBI/ login"


def cluster(environment: dict | None = None) -> dict:
    pipeline = {"runConfig": "workloads/configs/cluster.json", **({"environment": environment} if environment else {})}
    return {"target": "cluster", "cluster": {"loginHost": "192.0.2.7", "hostKey": HOST_KEY}, "pipeline": pipeline}


def test_cloud_stacks_build_from_the_index_and_the_local_stack_keeps_its_venv() -> None:
    assert load_stack_config("demo").environment.source == "index"
    assert load_stack_config("demo").environment.lock == "jail"
    assert load_stack_config("local").environment is None
    rehearsal = load_stack_config("cluster")
    assert (rehearsal.environment.source, rehearsal.environment.lock) == ("wheelhouse", "local")
    assert rehearsal.pipeline.python == "/usr/bin/python3"


@pytest.mark.parametrize(("environment", "message"), [
    ({"source": "container"}, "give it exactly when environment.source is container"),
    ({"source": "index", "image": "nvcr.io/nvidia/pytorch:25.10-py3"}, "give it exactly when"),
    ({"source": "conda"}, "source"),
    ({"root": "shared/env"}, "must be an absolute path"),
    ({"root": "/nonexistent/../../etc"}, r"environment.root.*'/nonexistent/../../etc' must not contain '\.\.'"),
    ({"root": "/home/shared/env/.."}, "must not contain"),
    ({"source": "container", "image": "nvcr.io/nvidia/pytorch:25.10-py3"}, "nvcr.io#nvidia/pytorch:25.10-py3"),
])
def test_bad_environments_are_refused_naming_the_field(environment: dict, message: str) -> None:
    with pytest.raises(StackConfigError, match=message):
        parse_stack_config("c", cluster(environment), "stacks/Pulumi.c.yaml")


def test_an_environment_root_is_normalised_and_stays_under_the_jail_root() -> None:
    from infra.environment.plan import environment_plan

    values = cluster({"root": "//home//shared/./env/"})
    values["cluster"]["jailRoot"] = "/srv/jail"
    stack = parse_stack_config("c", values, "stacks/Pulumi.c.yaml")
    assert stack.environment.root == "/home/shared/env"
    assert environment_plan(stack).root == "/srv/jail/home/shared/env"


def test_the_local_stack_refuses_an_environment() -> None:
    values = {"target": "local", "pipeline": {"runConfig": "workloads/configs/local.json",
                                               "environment": {"source": "index"}}}
    with pytest.raises(StackConfigError, match="the local stack runs the repository's venv"):
        parse_stack_config("l", values, "stacks/Pulumi.l.yaml")


def test_the_chain_starts_with_the_environment_and_readiness_expects_the_stack_s_cuda() -> None:
    from pathlib import Path

    from documents.run_config import load_run_config
    from infra.pipeline.chain import pipeline_jobs, code_location_for

    repo = Path(__file__).resolve().parents[1]
    demo = load_stack_config("demo")
    run = load_run_config(repo / demo.pipeline.run_config)
    jobs = pipeline_jobs(demo, run, demo.pipeline.run_config, "c", code_location_for(demo, run, repo))
    assert [j.stage for j in jobs] == ["environment", "prepare", "readiness", "train", "eval"]
    environment, prepare, readiness = jobs[:3]
    # a Nebius stack builds in the housekeeping partition (infra/soperator/values.py HOUSEKEEPING)
    assert environment.extra_args[:2] == ["--partition=housekeeping", "--nodes=1"]
    assert environment.env == {"FT_PYTHON": "python3"}
    assert environment.args == [f"/home/shared/finetune_env/sources/{environment.results_path.rsplit('/', 1)[1]}",
                                "/home/shared/finetune_env"]
    assert prepare.depends_on == ["environment"] and prepare.env["FT_PYTHON"] == f"{environment.results_path}/bin/python"
    assert readiness.args[readiness.args.index("--expect-cuda") + 1] == "13.0.2"


@pytest.mark.parametrize("image", ["nvcr.io#nvidia/pytorch:25.10-py3", "ubuntu:24.04", "nvidia/cuda:13.0.2-base",
                                   "/home/shared/images/pytorch.sqsh"])
def test_container_images_in_pyxis_form_are_taken(image: str) -> None:
    stack = parse_stack_config("c", cluster({"source": "container", "image": image}), "stacks/Pulumi.c.yaml")
    assert stack.environment.image == image


SERVE_LOCK = Path(__file__).resolve().parents[1] / "locks" / "requirements-serve-jail.txt"


def _chain(stack_name: str, serve: bool) -> dict:
    from documents.run_config import load_run_config
    from infra.pipeline.chain import code_location_for, pipeline_jobs

    repo = Path(__file__).resolve().parents[1]
    stack = load_stack_config(stack_name)
    run = load_run_config(repo / stack.pipeline.run_config)
    location = code_location_for(stack, run, repo)
    return {j.stage: j for j in pipeline_jobs(stack, run, stack.pipeline.run_config, "c", location, serve=serve)}


@pytest.mark.parametrize("stack_name", ["h100", "demo"])
def test_a_chain_serving_on_gpus_builds_vllm_s_environment_and_serves_from_it(stack_name: str) -> None:
    """Issue 53: the environment job builds the serving lock's jail target beside the workloads' environment; serve
    and readiness get its interpreter as FT_VLLM_PYTHON, the other stages do not."""
    key = f"{hashlib.sha256(SERVE_LOCK.read_bytes()).hexdigest()[:16]}-cp312-manylinux_2_28_x86_64"
    folder = f"/home/shared/finetune_env/{key}"
    jobs = _chain(stack_name, serve=True)
    environment = jobs["environment"]
    assert environment.args[1:] == ["/home/shared/finetune_env", f"/home/shared/finetune_env/sources/{key}"]
    assert jobs["serve"].env["FT_VLLM_PYTHON"] == jobs["readiness"].env["FT_VLLM_PYTHON"] == f"{folder}/bin/python"
    assert all("FT_VLLM_PYTHON" not in jobs[stage].env for stage in ("prepare", "train", "eval"))
    assert jobs["serve"].env["FT_PYTHON"] == f"{environment.results_path}/bin/python" != f"{folder}/bin/python"
    quiet = _chain(stack_name, serve=False)
    assert quiet["environment"].args == environment.args[:2], "no serve stage: only the workloads' environment"
    assert quiet["environment"].fingerprint != environment.fingerprint, "the fingerprint covers the serving key"
    assert all("FT_VLLM_PYTHON" not in job.env for job in quiet.values())


def test_the_serving_environment_is_the_serving_lock_s_vllm_and_cpu_workers_have_none() -> None:
    from infra.environment.plan import environment_plan

    serving = environment_plan(load_stack_config("h100")).serving
    assert (serving.lock, serving.vllm_version, serving.python_version) == ("serve-jail", "0.33.0", "3.12")
    assert re.search(r"^vllm==0\.33\.0 ", SERVE_LOCK.read_text(), re.M)
    rehearsal = load_stack_config("cluster")
    assert environment_plan(rehearsal).serving is None
    assert "FT_VLLM_PYTHON" not in _chain("cluster", serve=True)["serve"].env


def test_ftstack_plan_shows_the_serving_environment_of_h100() -> None:
    """`ftstack plan --stack h100` names the serving environment (lock hash, vLLM version, folder); `--json` and so
    the stack outputs' environment section carry it."""
    import json
    import subprocess
    import sys

    ftstack = str(Path(sys.executable).with_name("ftstack"))
    repo = Path(__file__).resolve().parents[1]
    lock = hashlib.sha256(SERVE_LOCK.read_bytes()).hexdigest()[:16]
    folder = f"/home/shared/finetune_env/{lock}-cp312-manylinux_2_28_x86_64"
    text = subprocess.run([ftstack, "plan", "--stack", "h100"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    [line] = [line for line in text.stdout.splitlines() if line.startswith("Serving environment:")]
    assert f"vLLM 0.33.0, lock {lock} (locks/requirements-serve-jail.txt" in line and f"into {folder};" in line
    document = subprocess.run([ftstack, "plan", "--stack", "h100", "--json"], cwd=repo, capture_output=True, text=True,
                              timeout=300)
    environment = json.loads(document.stdout)["environment"]
    assert (environment["serving_lock_hash"], environment["serving_vllm_version"]) == (lock, "0.33.0")
    assert environment["serving_python"] == f"{folder}/bin/python"
