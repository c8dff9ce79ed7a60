"""The stack's `pipeline.environment`: defaults per target, and what it refuses."""

from __future__ import annotations

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
    # no CPU worker set on demo: the build takes a GPU worker's CPUs (2gpu-64vcpu-384gb)
    assert environment.extra_args == ["--nodes=1", "--cpus-per-task=64"] and environment.env == {"FT_PYTHON": "python3"}
    assert environment.args == [f"/home/shared/finetune_env/sources/{environment.results_path.rsplit('/', 1)[1]}",
                                "/home/shared/finetune_env"]
    assert prepare.depends_on == ["environment"] and prepare.env["FT_PYTHON"] == f"{environment.results_path}/bin/python"
    assert readiness.args[readiness.args.index("--expect-cuda") + 1] == "13.0.2"


@pytest.mark.parametrize("image", ["nvcr.io#nvidia/pytorch:25.10-py3", "ubuntu:24.04", "nvidia/cuda:13.0.2-base",
                                   "/home/shared/images/pytorch.sqsh"])
def test_container_images_in_pyxis_form_are_taken(image: str) -> None:
    stack = parse_stack_config("c", cluster({"source": "container", "image": image}), "stacks/Pulumi.c.yaml")
    assert stack.environment.image == image
