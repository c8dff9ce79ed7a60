"""Issue 54 item 7: `max_steps: 10**30` planned 1.1e24 GPU-hours and a train time limit of
`35171320123380893622818-03:42:00`. A run config is bounded field by field, the plan refuses a run over the stack's
cost or time ceiling naming both figures, and no Slurm time limit is ever formatted past a year."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from documents.run_config import ConfigError, load_run_config
from documents.sections.time_limits import TimeLimitsConfig
from infra.commands.cli import main as ftstack
from infra.config import REPO_ROOT, load_run, load_stack_config
from infra.cost.price import price_stack
from planning.time_limits import TimeLimitError, slurm_duration, train_time_limit
from infra.runs.measured import price_inputs

YEAR = "366-00:00:00"
"""366 days as Slurm prints a TimeLimit (D-HH:MM:SS): the longest a stage may ask for."""


@pytest.mark.parametrize("section,field,value,bound", [
    ("train", "max_steps", 10**30, "10000000"),
    ("train", "epochs", 1e9, "1000"),
    ("train", "micro_batch_size", 10**6, "4096"),
    ("data", "rows", 10**12, "1000000000"),
    ("time_limits", "train_minutes", 10**12, str(366 * 24 * 60)),
])
def test_a_run_config_past_a_bound_is_refused_naming_the_field_and_the_bound(
        tmp_path: Path, section: str, field: str, value: float, bound: str) -> None:
    config = json.loads((REPO_ROOT / "workloads" / "configs" / "dev.json").read_text())
    config.setdefault(section, {})[field] = value
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError) as refused:
        load_run_config(path)
    assert f"{section}.{field}" in str(refused.value) and bound in str(refused.value), refused.value


def test_slurm_time_limits_are_one_minute_to_a_year() -> None:
    assert slurm_duration(1) == "00:01:00" and slurm_duration(366 * 24 * 60) == YEAR
    assert slurm_duration(25 * 60 + 7) == "1-01:07:00"
    for minutes in (0, 366 * 24 * 60 + 1, 35171320123380893622818 * 24 * 60):
        with pytest.raises(TimeLimitError, match="1 to 527040 minutes"):
            slurm_duration(minutes)


@pytest.mark.parametrize("wall_hours", [1.1e24, math.inf, math.nan])
def test_training_never_gets_an_absurd_time_limit(wall_hours: float) -> None:
    with pytest.raises(TimeLimitError, match=f"exceeds {YEAR}"):
        train_time_limit(TimeLimitsConfig(), wall_hours)
    # a week's estimate x 1.5 + 30 min, the section's defaults
    assert train_time_limit(TimeLimitsConfig(), 168.0)[0] == 168 * 60 * 3 // 2 + 30


def stack_dir(tmp_path: Path, run_config: Path, **pipeline: float) -> Path:
    """stacks/Pulumi.dev.yaml with its run config at `run_config` and the given pipeline keys."""
    document = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    section = document["config"]["soperator-finetune:pipeline"]
    section.update(runConfig=str(run_config), **pipeline)
    folder = tmp_path / "stacks"
    folder.mkdir()
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document))
    return folder


def dev_run(tmp_path: Path, max_steps: int) -> Path:
    config = json.loads((REPO_ROOT / "workloads" / "configs" / "dev.json").read_text())
    config["train"]["max_steps"] = max_steps
    path = tmp_path / "dev-long.json"
    path.write_text(json.dumps(config))
    return path


def test_the_default_ceilings_refuse_ten_million_steps_on_dev_naming_both_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The dev stack prices its 200 steps at well under an hour; the most steps a run config may ask for is a
    week's wall time and $10,000 many times over."""
    folder = stack_dir(tmp_path, dev_run(tmp_path, 10_000_000))
    cfg = load_stack_config("dev", folder)
    assert (cfg.pipeline.max_run_usd, cfg.pipeline.max_run_hours) == (10_000.0, 168.0)
    training = price_stack(cfg, price_inputs(cfg, REPO_ROOT), run=load_run(cfg)).training
    assert training is not None and training.wall_hours and training.usd

    assert ftstack(["plan", "--stack", "dev", "--config-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"an estimated {training.wall_hours:,.1f} h of wall time, over pipeline.maxRunHours 168 h" in err, err
    assert f"an estimated ${training.usd:,.2f}, over pipeline.maxRunUsd $10,000.00" in err, err
    assert "run 'dev'" in err and str(tmp_path / "dev-long.json") in err, err


def test_a_lowered_cost_ceiling_refuses_the_shipped_dev_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = stack_dir(tmp_path, REPO_ROOT / "workloads" / "configs" / "dev.json", maxRunUsd=0.25)
    assert ftstack(["plan", "--stack", "dev", "--config-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "over pipeline.maxRunUsd $0.25" in err and "maxRunHours" not in err, err


def test_ceilings_raised_past_a_year_still_get_no_absurd_time_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = stack_dir(tmp_path, dev_run(tmp_path, 10_000_000), maxRunUsd=1e12, maxRunHours=1e12)
    assert ftstack(["plan", "--stack", "dev", "--config-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"exceeds {YEAR}, the longest a stage may ask for" in err, err
