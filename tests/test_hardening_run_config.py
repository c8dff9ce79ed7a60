"""Issue 64 item 7: run configs that planned with rc 0 and failed on the cluster are refused by the plan.

Probes (each planned fine before): `max_steps: true` (read as 1); `checkpoint_dir: ../../../../etc`; a dataset
`file:/etc/shadow`; a base model `dir:/etc/hostname`; a text file given as GGUF; a `file:` dataset that is a text
file named .parquet. `ftstack plan --stack local --config-dir DIR`, DIR's stack pointing at the run config:
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from documents.run_config import ConfigError, parse_run_config
from infra.commands.cli import main
from train_fixtures import ROOT

LOCAL = json.loads((ROOT / "workloads/configs/local.json").read_text())


def _with(section: str, **values: object) -> dict:
    data = json.loads(json.dumps(LOCAL))
    data[section] = {**data.get(section, {}), **values}
    return data


@pytest.mark.parametrize(("section", "values", "field"), [
    ("train", {"max_steps": True}, "train.max_steps"),
    ("train", {"max_steps": 2.5}, "train.max_steps"),
    ("train", {"save_steps": "3"}, "train.save_steps"),
    ("data", {"shuffle": 1}, "data.shuffle"),
    ("eval", {"num_prompts": False}, "eval.num_prompts"),
    ("train", {"checkpoint_dir": "../../../../etc"}, "train.checkpoint_dir"),
    ("paths", {"output_dir": "outputs/../../elsewhere"}, "paths.output_dir"),
    ("data", {"source": "file:/etc/shadow"}, "data.source"),
])
def test_a_field_of_the_wrong_kind_or_leaving_the_run_root_is_refused(section: str, values: dict,
                                                                     field: str) -> None:
    with pytest.raises(ConfigError, match=rf"  {field}: "):
        parse_run_config(_with(section, **values), "run.json")


def test_numbers_take_integers_and_paths_are_normalised() -> None:
    run = parse_run_config(_with("train", max_grad_norm=2, checkpoint_dir="ckpt/./a/../b"), "run.json")
    assert run.train is not None and run.train.max_grad_norm == 2.0 and run.train.checkpoint_dir == "ckpt/b"
    assert run.checkpoints_dir == run.root / "ckpt" / "b"


def _plan(tmp_path: Path, run: dict, capsys: pytest.CaptureFixture[str], command: str = "plan") -> tuple[int, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "run.json"
    config.write_text(json.dumps(run))
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.local.yaml").read_text())
    stack["config"]["soperator-finetune:pipeline"]["runConfig"] = str(config)
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.local.yaml").write_text(yaml.safe_dump(stack))
    code = main([command, "--stack", "local", "--config-dir", str(stacks)])
    return code, capsys.readouterr().err


def test_sources_the_plan_can_read_are_checked_for_what_they_claim(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "model.gguf"
    text.write_text("not a model\n")
    fake_parquet = tmp_path / "rows.parquet"
    fake_parquet.write_text("user,assistant\n")
    cases = [
        ({"model": {"source": "dir:/etc/hostname"}}, "model.source dir:/etc/hostname: /etc/hostname is a file"),
        ({"model": {"source": f"gguf:{text}"}}, f"model.source gguf:{text}: {text} is not a GGUF file"),
        ({"model": {"source": f"dir:{tmp_path}"}}, f"{tmp_path} holds no config.json"),
        ({"data": {"source": f"file:{fake_parquet}"}}, f"{fake_parquet} is not a Parquet file"),
        ({"data": {"source": f"file:{tmp_path / 'missing.jsonl'}"}}, f"{tmp_path / 'missing.jsonl'} does not exist"),
    ]
    for number, (change, message) in enumerate(cases):
        code, err = _plan(tmp_path / f"case{number}", {**LOCAL, **change}, capsys)
        assert code == 2 and message in err, (change, err)
        assert err.startswith("ftstack plan: ") and "run.json" in err


def test_the_shipped_local_config_still_plans_through_the_check(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _plan(tmp_path, LOCAL, capsys)
    assert code == 0, err


def test_ftstack_run_refuses_the_same_sources_before_it_submits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """In a repository of its own (its .local/ state and lock, not this checkout's, which a demo may be using)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.chdir(repo)
    code, err = _plan(tmp_path, {**LOCAL, "model": {"source": "dir:/etc/hostname"}}, capsys, command="run")
    assert code == 1 and "ftstack run: " in err and "/etc/hostname is a file, not a model folder" in err, err
