"""The stack outputs contract: the README lists every output key, its type and unit; the program
produces exactly those keys (mock run of every stack), so dashboards cannot break silently."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from document_fixtures import evaluator_report, side

from documents.adapter_registry import AdapterEntry, AdapterSpeed, ServedSet
from documents.base import DocumentError
from documents.stack_outputs import parse_stack_outputs, read_stack_outputs
from infra.commands.run import run_outputs
from infra.config import StackConfig, load_run, load_stack_config
from infra.cost.price import PriceInputs, price_stack
from infra.pipeline.runner import PipelineRun
from infra.program.mocks import SECRET, run_under_mocks
from infra.output_sections import served_speeds

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "README.md"
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (REPO / "stacks").glob("Pulumi.*.yaml"))
FTSTACK = str(Path(sys.executable).with_name("ftstack"))
TYPES = {"string", "number", "integer", "secret", "list"}


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
        if self.type == "list":
            return isinstance(value, list) and all(isinstance(item, str) for item in value)
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
    runs[f"{gpu_stack}+served"] = waited_outputs(load_stack_config(gpu_stack, REPO / "stacks"), SERVED)
    return runs


SERVED = ServedSet(
    base_name="base", base_model_sha256="b" * 64, base_model_path="/models/base", engine="vllm",
    adapters=[AdapterEntry(name=name, run_id=f"run-{name}", adapter_dir=f"/runs/{name}", base_model_sha256="b" * 64)
              for name in ("desk-earnings", "desk-credit")],
    speed={"desk-earnings": AdapterSpeed(requests=3, completion_tokens=300, tokens_per_second=50.0,
                                         time_to_first_token_s=0.2)},
)
"""a server with two adapters, one of which has answered (the other's figures stay null)"""


def waited_outputs(cfg: StackConfig, served: ServedSet | None = None) -> dict[str, Any]:
    """The outputs `ftstack run --wait` writes once the chain finished and the eval job reported."""
    jobs = {stage: {"job_id": str(100 + i), "state": "COMPLETED", "exit_code": 0, "elapsed_s": 30 + i}
            for i, stage in enumerate(("prepare", "readiness", "train", "eval"))}
    result = PipelineRun(stack=cfg.stack, started_at=None, bundle_hash="0123456789abcdef", submitted=list(jobs),
                         kept=[], jobs=jobs, evaluation=evaluator_report("103", side(9.0, 20.0), side(6.0, 41.5)))
    inputs = PriceInputs(served_speeds=served_speeds(served)).with_evaluation(result.evaluation)
    return run_outputs(cfg, price_stack(cfg, inputs, load_run(cfg, REPO)), result, served).flat()


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


def test_served_adapters_are_priced_per_chat_at_their_own_speed(produced: dict[str, dict[str, Any]]) -> None:
    """Cost per chat of an adapter: the cluster's daily cost over the chats its measured tokens/s serves a day."""
    stack = next(k for k in produced if k.endswith("+served"))
    outputs, cfg = produced[stack], load_stack_config(stack.split("+")[0], REPO / "stacks")
    assert outputs["served_adapters"] == ["desk-earnings", "desk-credit"]
    chat = cfg.pricing.chat
    daily = price_stack(cfg, PriceInputs(), load_run(cfg, REPO)).monthly.usd_high / chat.days_per_month
    chats_per_day = 50.0 * 86400 / 2000  # the demo run config's serve.max_tokens_limit (default: seed 000's 2K)
    assert outputs["served_adapter_desk_earnings_usd_per_chat"] == pytest.approx(daily / chats_per_day, abs=1e-4)
    assert outputs["served_adapter_desk_earnings_run_id"] == "run-desk-earnings"
    assert outputs["served_adapter_desk_credit_usd_per_chat"] is None
    assert outputs["served_adapter_desk_credit_tokens_per_second"] is None


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


def test_outputs_read_back_through_their_model(produced: dict[str, dict[str, Any]]) -> None:
    """Every stack's exported keys are exactly the flattened typed outputs they read back as."""
    for stack, outputs in produced.items():
        model = parse_stack_outputs(outputs, stack)
        assert model.flat() == outputs, stack
        assert model.stack == stack.split("+")[0]


def test_preview_exports_the_same_keys_with_the_costs_known() -> None:
    """`pulumi preview` shows the cost figures (cost review) while ids and job states are still unknown."""
    cfg = load_stack_config("demo", REPO / "stacks")
    preview = run_under_mocks(cfg, preview=True).outputs
    update = run_under_mocks(cfg).outputs
    assert preview.keys() == update.keys()
    assert {k: v for k, v in preview.items() if k.startswith("cost_")} == \
        {k: v for k, v in update.items() if k.startswith("cost_")}


def test_report_reads_what_pulumi_stack_output_json_prints(produced: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """The CLI's shape (a flat object, secrets as "[secret]") through standard input; an older program's
    outputs (no entity lists) fail naming the origin and the key."""
    printed = json.dumps(produced["demo"], indent=2)
    assert '"kubeconfig": "[secret]"' in printed
    page = subprocess.run([FTSTACK, "report", "--stack", "demo", "--outputs", "-", "--out", str(tmp_path / "d")],
                          input=printed, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert page.returncode == 0, page.stderr
    html = (tmp_path / "d" / "index.html").read_text()
    monthly = produced["demo"]["cost_monthly_usd_high"]
    assert f"${monthly:,.0f}" in html and produced["demo"]["cost_line_compute_worker_worker_label"] in html
    older = {k: v for k, v in produced["demo"].items() if k != "cost_lines"}
    with pytest.raises(DocumentError, match=r"^outputs\.json: stack outputs lack the key 'cost_lines'"):
        read_stack_outputs(json.dumps(older), "outputs.json")
    failed = subprocess.run([FTSTACK, "report", "--stack", "demo", "--outputs", "-", "--out", str(tmp_path / "e")],
                            input=json.dumps(older), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2 and "standard input: stack outputs lack the key 'cost_lines'" in failed.stderr
