"""The stack outputs contract: the README lists every output key, its type and unit; the program
produces exactly those keys (mock run of every stack), so dashboards cannot break silently."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from document_fixtures import evaluator_report, side

from infra.commands.run import run_outputs
from infra.config import StackConfig, load_stack_config
from infra.cost_report import cost_report
from infra.mocks import SECRET, run_under_mocks
from infra.pipeline.runner import PipelineRun

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "README.md"
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (REPO / "stacks").glob("Pulumi.*.yaml"))
TYPES = {"string", "number", "integer", "secret"}


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    unit: str
    when: str
    pattern: re.Pattern[str]

    def accepts(self, value: Any) -> bool:
        if value is None:
            return "null until" in self.when
        if self.type == "secret":
            return value == SECRET
        if self.type == "string":
            return isinstance(value, str) and value != SECRET
        if self.type == "integer":
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, (int, float)) and not isinstance(value, bool)


def contract_rows() -> list[Row]:
    text = DOC.read_text()
    body = text.split("<!-- outputs-contract:start -->", 1)[1].split("<!-- outputs-contract:end -->", 1)[0]
    rows = []
    for number, line in enumerate(body.strip().splitlines()[2:], start=3):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"{DOC}: contract table line {number} has {len(cells)} cells: {line!r}"
        key, type_, unit, when, _ = cells
        assert key.startswith("`") and key.endswith("`"), f"{DOC}: contract line {number}: key not in backticks"
        key = key.strip("`")
        assert type_ in TYPES, f"{DOC}: {key}: type {type_!r} not one of {sorted(TYPES)}"
        assert unit, f"{DOC}: {key}: unit missing (use '-' for none)"
        regex = "^" + re.sub(r"<[a-z]+>", "[a-z0-9_]+", re.escape(key).replace(r"\<", "<").replace(r"\>", ">")) + "$"
        rows.append(Row(key, type_, unit, when, re.compile(regex)))
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys)), f"{DOC}: duplicate rows"
    return rows


def with_training_throughput(cfg: StackConfig) -> StackConfig:
    training = cfg.pricing.training.model_copy(update={"tokens_per_second_per_gpu": 1500.0})
    return cfg.model_copy(update={"pricing": cfg.pricing.model_copy(update={"training": training})})


@pytest.fixture(scope="module")
def produced() -> dict[str, dict[str, Any]]:
    """Outputs of the mock run of every stack, plus a cloud stack whose training throughput is known."""
    runs = {name: run_under_mocks(load_stack_config(name, REPO / "stacks")).outputs for name in STACKS}
    gpu_stack = next(n for n in STACKS if runs[n]["target"] == "nebius" and "training_run_gpus" in runs[n])
    runs[f"{gpu_stack}+throughput"] = run_under_mocks(
        with_training_throughput(load_stack_config(gpu_stack, REPO / "stacks"))).outputs
    runs[f"{gpu_stack}+waited"] = waited_outputs(load_stack_config(gpu_stack, REPO / "stacks"))
    return runs


def waited_outputs(cfg: StackConfig) -> dict[str, Any]:
    """The outputs `ftstack run --wait` writes once the chain finished and the eval job reported."""
    jobs = {stage: {"job_id": str(100 + i), "state": "COMPLETED", "exit_code": 0, "elapsed_s": 30 + i}
            for i, stage in enumerate(("prepare", "readiness", "train", "eval"))}
    result = PipelineRun(stack=cfg.stack, started_at=None, bundle_hash="0123456789abcdef", submitted=list(jobs),
                         kept=[], jobs=jobs, evaluation=evaluator_report("103", side(9.0, 20.0), side(6.0, 41.5)))
    return run_outputs(cfg, cost_report(cfg), result)


def test_a_waited_pipeline_fills_eval_elapsed_and_measured_keys_with_numbers(produced: dict[str, dict[str, Any]]) -> None:
    waited = next(outputs for name, outputs in produced.items() if name.endswith("+waited"))
    filled = {k: v for k, v in waited.items()
              if k.startswith(("eval_", "cost_per_chat_measured_")) or (k.startswith("pipeline_") and k.endswith("_elapsed_s"))}
    assert len([k for k in filled if k.startswith("eval_")]) == 12 and len([k for k in filled if "measured" in k]) == 3
    assert len([k for k in filled if k.endswith("_elapsed_s")]) == 4
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in filled.values()), filled
    assert waited["eval_tokens_per_second_finetuned"] == waited["cost_per_chat_measured_tokens_per_second"] == 41.5
    daily = waited["cost_monthly_usd_high"] / 30
    assert waited["cost_per_chat_measured_usd"] == pytest.approx(daily / (41.5 * 86_400 / 2000), rel=1e-3)


def match(rows: list[Row], key: str) -> Row | None:
    """The row naming `key`: an exact row, else the matching pattern with the most literal text."""
    candidates = [r for r in rows if r.key == key] or [r for r in rows if r.pattern.match(key)]
    return max(candidates, key=lambda r: len(re.sub(r"<[a-z]+>", "", r.key)), default=None)


def test_every_produced_key_is_documented_with_its_type(produced: dict[str, dict[str, Any]]) -> None:
    rows = contract_rows()
    problems = []
    for stack, outputs in produced.items():
        for key, value in outputs.items():
            row = match(rows, key)
            if row is None:
                problems.append(f"{stack}: output {key!r} is not in the table of {DOC.name}")
            elif not row.accepts(value):
                problems.append(f"{stack}: output {key!r} = {value!r} is not of documented type {row.type!r}")
    assert not problems, "\n".join(problems)


def test_every_documented_key_is_produced(produced: dict[str, dict[str, Any]]) -> None:
    rows = contract_rows()
    matched = {match(rows, key).key for outputs in produced.values() for key in outputs if match(rows, key)}
    missing = [r.key for r in rows if r.key not in matched]
    assert not missing, f"documented in {DOC.name} but produced by no stack: {missing}"


def test_always_and_nebius_keys_are_present_where_promised(produced: dict[str, dict[str, Any]]) -> None:
    rows = contract_rows()
    for stack in STACKS:
        cfg = load_stack_config(stack, REPO / "stacks")
        outputs = produced[stack]
        for row in rows:
            promised = row.when == "always" or (row.when == "nebius" and cfg.target == "nebius")
            if row.when == "nebius" and cfg.target == "local":
                assert not any(row.pattern.match(k) for k in outputs), f"{stack}: local stack has {row.key}"
            if promised:
                assert any(row.pattern.match(k) for k in outputs), f"{stack}: {row.key} ({row.when}) missing"


def test_secrets_stay_secret(produced: dict[str, dict[str, Any]]) -> None:
    secret_rows = [r for r in contract_rows() if r.type == "secret"]
    assert secret_rows
    for outputs in produced.values():
        for row in secret_rows:
            for key, value in outputs.items():
                if row.pattern.match(key):
                    assert value == SECRET
