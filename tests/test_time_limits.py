"""Each stage's Slurm time limit (issue 42, item 9): from the run config's `time_limits` section, training's from the
cost model's estimate with its margin; carried by the chain as `sbatch --time`, shown by `ftstack plan`, and seen
by Slurm on a job submitted with the chain's arguments."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from documents.run_config import ConfigError, load_run_config, parse_run_config
from documents.sections.time_limits import TimeLimitsConfig
from infra.commands.cli import main
from infra.config import load_stack_config
from infra.pipeline.chain import pipeline_jobs, code_location_for
from infra.plans import stack_plan
from infra.pipeline.chain import job_arguments
from infra.pipeline.jobs import SlurmJobProvider, job_inputs, sbatch_extra_args, submit_stage
from infra.pipeline.slurm import SlurmClient
from planning.time_limits import slurm_duration, stage_time_limits, train_time_limit
from slurm_jobs import job_field

REPO = Path(__file__).resolve().parents[1]


def test_training_limit_is_the_estimate_with_its_margin_else_seed_001s_six_hours() -> None:
    limits = TimeLimitsConfig()
    assert train_time_limit(limits, 2.0)[0] == 120 * 1.5 + 30
    assert train_time_limit(limits, 0.01)[0] == 1 + 30, "0.6 min x 1.5 = 0.9 min rounds up to a whole minute"
    assert train_time_limit(limits, None) == (6 * 60, "default: no training estimate")
    assert train_time_limit(TimeLimitsConfig(train_margin=2.0, train_overhead_minutes=0), 1.25)[0] == 150
    assert train_time_limit(TimeLimitsConfig(train_minutes=45), 2.0) == (45, "run config")


def test_every_stage_but_the_server_has_a_limit() -> None:
    limits = stage_time_limits(TimeLimitsConfig(prepare_minutes=7), None)
    assert limits == {"environment": 60, "prepare": 7, "readiness": 30, "train": 360, "eval": 120, "serve": None,
                      "publish": 15}


@pytest.mark.parametrize("minutes, slurm", [(30, "00:30:00"), (210, "03:30:00"), (1440, "1-00:00:00"),
                                            (1501, "1-01:01:00")])
def test_slurm_duration_is_how_scontrol_prints_a_time_limit(minutes: int, slurm: str) -> None:
    assert slurm_duration(minutes) == slurm


def test_a_bad_limit_names_the_field() -> None:
    document = json.loads((REPO / "workloads/configs/local.json").read_text())
    with pytest.raises(ConfigError, match="time_limits.train_margin"):
        parse_run_config({**document, "time_limits": {"train_margin": 0.5}}, "local.json")


def _chain(stack: str, train_hours: float | None):
    """The chain submitted from the stack's plan with training estimated at `train_hours`."""
    cfg = load_stack_config(stack, REPO / "stacks")
    run = load_run_config(REPO / cfg.pipeline.run_config)
    plan = stack_plan(cfg, run)
    train = plan.stages["train"].model_copy(update={"time_limit_minutes": train_time_limit(run.time_limits,
                                                                                           train_hours)[0]})
    plan = plan.model_copy(update={"stages": {**plan.stages, "train": train}})
    return {j.stage: j for j in pipeline_jobs(cfg, run, cfg.pipeline.run_config, "c", code_location_for(cfg, run, REPO),
                                              serve=True, plan=plan)}


def _props(job, **overrides):
    args = {"script": job.script, "bundle_path": "/b", "fingerprint": job.fingerprint, "transport": {"kind": "local"},
            "args": job.args, "env": job.env, "job_name": f"ft-{job.stage}", "output": job.output,
            "extra_args": job.extra_args, "time_limit_minutes": job.time_limit_minutes}
    return job_inputs(**{**args, **overrides})


def test_the_chains_sbatch_arguments_carry_each_stages_time() -> None:
    jobs = _chain("demo", 2.0)
    sbatch = {stage: sbatch_extra_args(job_inputs(**job_arguments(
        job, bundle_path="/b", dependencies=[], transport={"kind": "local"}, slurm_env={}, wait=False)))
        for stage, job in jobs.items()}
    times = {stage: [a for a in args if a.startswith("--time=")] for stage, args in sbatch.items()}
    assert times == {"environment": ["--time=60"], "prepare": ["--time=120"], "readiness": ["--time=30"],
                     "train": ["--time=210"], "eval": ["--time=120"], "serve": []}
    assert sbatch["train"][:-1] == jobs["train"].extra_args, "the placement stays, the time comes last"


def test_a_new_estimate_updates_a_job_without_replacing_it() -> None:
    """A run that measured its throughput changes the next estimate; the finished training is kept."""
    before, after = _chain("demo", 2.0)["train"], _chain("demo", 3.0)["train"]
    assert before.time_limit_minutes != after.time_limit_minutes
    diff = SlurmJobProvider().diff("1", _props(before), _props(after))
    assert diff.changes and not diff.replaces


def test_plan_shows_each_stages_limit_and_trains_from_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", "--stack", "demo", "--json"])
    document = json.loads(capsys.readouterr().out)
    wall_hours = document["cost"]["training_run"]["wall_hours"]
    assert wall_hours > 0
    minutes = document["time_limits"]["minutes"]
    assert minutes["train"] == math.ceil(wall_hours * 60 * 1.5) + 30
    assert minutes["prepare"] == 120 and "serve" in minutes, "demo serves; its server has no limit"
    assert minutes["serve"] is None and minutes["environment"] == 60


def test_slurm_holds_a_job_to_the_chains_time_limit(slurm: str, slurm_client: SlurmClient, tmp_path: Path) -> None:
    """The local stack's train job as the chain submits it (a held stand-in script, so it never runs)."""
    train = _chain("local", 0.5)["train"]
    assert train.time_limit_minutes == 75
    (tmp_path / "stand_in.sh").write_text("#!/bin/sh\nsleep 600\n")
    props = _props(train, script="stand_in.sh", bundle_path=str(tmp_path), args=[], output=str(tmp_path / "o.out"),
                   extra_args=[*train.extra_args, "--hold"], slurm_env={"SLURM_CONF": slurm})
    job = submit_stage(props)["job_id"]
    try:
        assert job_field(job, "TimeLimit", Path(slurm)) == "01:15:00"
    finally:
        slurm_client.cancel(job)
