"""Storage that fits: every path of a stack's run config on a filesystem the stack mounts, what lands on each
filesystem (base model, data, kept checkpoints, exported models, environment), the refusal naming filesystem, need
and size, in the policy and in `ftstack plan`. Mount paths and sizes come from stacks/Pulumi.<stack>.yaml; a full
fine-tune's checkpoint is its parameters in fp32 plus AdamW's two fp32 moments (12 bytes a parameter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from documents.run_config import RunConfig, load_run_config
from infra.commands.cli import main as ftstack
from infra.config import StackConfig, load_stack_config
from infra.storage_fit import storage_use, storage_violations
from policies import rules
from planning.model_shapes import shape_for_source

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
LLAMA_70B_PARAMS = 70.6e9  # Meta's model card for Llama 3.1 70B


def stack_and_run(stack: str) -> tuple[StackConfig, RunConfig]:
    cfg = load_stack_config(stack)
    return cfg, load_run_config(ROOT / cfg.pipeline.run_config)


def full_70b(run: RunConfig) -> RunConfig:
    """h100's run as a full fine-tune of Llama 3.1 70B, three checkpoints kept."""
    data = run.model_dump(mode="json")
    data["model"]["source"] = "hub:meta-llama/Llama-3.1-70B"
    data["train"] = {**data["train"], "method": "full", "quantization": "none", "save_total_limit": 3}
    return RunConfig.model_validate(data)


def test_h100_writes_everything_on_its_own_submounts() -> None:
    cfg, run = stack_and_run("h100")
    uses = {u.name: u for u in storage_use(cfg, run, shape_for_source(run.model.source))}
    assert {(u.name, u.mount_path, u.size_gib) for u in uses.values()} == {
        ("jail", "/", 512), ("training", "/mnt/training", 2048), ("inference", "/mnt/inference", 1536)}
    assert [n.what for n in uses["jail"].needs] == ["python environment"]
    assert {n.what for n in uses["training"].needs} == {"data", "checkpoints (3 kept)"}
    assert {n.what for n in uses["inference"].needs} == {"base model", "exported models"}
    assert storage_violations(cfg, run, shape_for_source(run.model.source)) == []


def test_a_path_under_mnt_on_no_submount_is_refused() -> None:
    cfg, run = stack_and_run("h100")
    data = run.model_dump(mode="json")
    data["paths"]["checkpoint_dir"] = "/mnt/chkpt"
    moved = RunConfig.model_validate(data)
    assert storage_violations(cfg, moved, shape_for_source(run.model.source)) == [
        "paths.checkpoint_dir /mnt/chkpt/h100 is under /mnt but on no submount of the stack (submounts: /mnt/training, "
        "/mnt/inference); it would land on the jail"]


def test_checkpoints_that_cannot_fit_are_refused_with_the_figures() -> None:
    cfg, run = stack_and_run("h100")
    big = full_70b(run)
    shape = shape_for_source(big.model.source)
    assert shape.params == pytest.approx(LLAMA_70B_PARAMS, rel=0.01)
    one_checkpoint = LLAMA_70B_PARAMS * (4 + 8) / GIB
    assert one_checkpoint == pytest.approx(789, abs=2)  # the "about 790 GiB"
    training = next(u for u in storage_use(cfg, big, shape) if u.name == "training")
    assert training.need_gib > 3 * one_checkpoint * 0.99 > 2048 and not training.fits
    refused = storage_violations(cfg, big, shape)
    assert len(refused) == 1
    assert refused[0].startswith(f"filesystem training (/mnt/training): the run needs {training.need_gib:,.1f} GiB "
                                 "but it has 2,048 GiB (")
    assert "checkpoints (3 kept) 2,36" in refused[0]
    result = rules.storage_fits(rules.Context([], cfg, big))
    assert result == refused


def test_demo_plan_shows_how_full_each_filesystem_will_be(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert ftstack(["plan", "--stack", "demo"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("Storage of run demo"):].splitlines()[1:6]
    # stacks/Pulumi.demo.yaml: the jail and four submounts
    assert [line.split(" (")[0].split()[-1] for line in block] == ["jail", "data", "chkpt", "model", "home"]
    assert all(line.strip().startswith("ok") and "% full" in line for line in block)
    assert "model (/mnt/model, 1,024 GiB):" in block[3] and "base model" in block[3]
    assert ftstack(["plan", "--stack", "demo", "--json"]) == 0
    storage = json.loads(capsys.readouterr().out)["storage"]
    assert [(s["filesystem"], s["size_gib"], s["fits"]) for s in storage] == [
        ("jail", 256, True), ("data", 1024, True), ("chkpt", 1024, True), ("model", 1024, True), ("home", 256, True)]
