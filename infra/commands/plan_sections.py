"""The cost table, the training placement, the policy results and the method comparison that `ftstack plan`
adds after the resource tree.

`--policies` runs policies/rules.py against the run under mocks; a mandatory violation makes the plan
exit 1. `--policy-config FILE.json` takes the format of `pulumi preview --policy-pack-config`:
``{"<policy>": {"enforcementLevel": "advisory", "<property>": value}}``.
`--compare` adds the method comparison (infra/cost/method_comparison.py); `--compare-chart FILE.png|.svg` draws it too.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from documents.run_config import RunConfig
from documents.run_plan import RunPlan
from documents.stack_outputs import Environment
from documents.text_input import TextInputError, load_json
from infra.config import REPO_ROOT, StackConfig, load_run
from infra.cost.method_comparison import MethodComparison, compare, plot_comparison, render_comparison
from infra.cost.price import PriceInputs, price_stack
from infra.cost.render import render_table, report_document

from infra.environment.plan import EnvironmentPlan, environment_plan, environment_section
from planning.fit import planned_throughput, worker_fits
from infra.pipeline.chain import CHAIN, serving_stages
from planning.planner import refusals
from planning.time_limits import slurm_duration, train_time_limit
from infra.program.mocks import MockRun
from infra.runs.measured import price_inputs
from infra.storage_fit import storage_use, storage_violations
from planning.model_shapes import UnknownModel, shape_for_source


CHART_SUFFIXES = (".png", ".svg")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policies", action="store_true",
                        help="run the policy pack's rules; exit 1 on a mandatory violation")
    parser.add_argument("--policy-config", type=Path, help="policy config JSON (as for pulumi --policy-pack-config)")
    parser.add_argument("--compare", action="store_true",
                        help="compare full, LoRA and QLoRA of each known model size on the stack's GPU model")
    parser.add_argument("--compare-chart", type=Path, metavar="FILE",
                        help="also draw the comparison's costs as a chart (FILE.png or FILE.svg)")


@dataclass(frozen=True)
class PlanSections:
    text: str
    document: dict[str, Any]
    exit_code: int


def _policy_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        config = load_json(path.read_bytes(), str(path))
    except (OSError, TextInputError) as exc:
        raise SystemExit(f"ftstack plan: --policy-config {path}: {exc}") from None
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise SystemExit(f"ftstack plan: --policy-config {path}: expected {{policy: {{property: value}}}}")
    return config


def _plan_check() -> Callable[..., Any]:
    """The policy pack's offline check, registered under the `ftstack.plan_checks` entry point."""
    found = entry_points(group="ftstack.plan_checks", name="policies")
    if not found:
        raise SystemExit("ftstack plan --policies: no policy pack is installed "
                         "(entry point ftstack.plan_checks:policies; reinstall with `make venv`)")
    return next(iter(found)).load()


def _placement(cfg: StackConfig, run: RunConfig | None, plan: RunPlan | None) -> tuple[list[str], list[dict[str, Any]]]:
    """The run's parallelism, per-GPU estimate and fit on each GPU worker set at the plan's throughput (text lines,
    JSON)."""
    if run is None or run.train is None or cfg.nodes is None:
        return [], []
    try:
        fits = worker_fits(cfg.plan_stack(), run, shape_for_source(run.model.source), planned_throughput(plan))
    except UnknownModel as exc:
        return ["", f"Training placement: {exc}"], []
    if not fits:
        return [], []
    lines = ["", f"Training placement of {run.model.source} ({run.train.method}, parallelism {run.train.parallelism}):"]
    lines += [f"  {fit.describe()}" for fit in fits]
    return lines, [fit.model_dump(mode="json") for fit in fits]


def _storage(cfg: StackConfig, run: RunConfig | None) -> tuple[list[str], list[dict[str, Any]], list[str]]:
    """What the run writes on each filesystem of the stack and how full each will be (text lines, JSON, refusals)."""
    if run is None or cfg.filesystems is None:
        return [], [], []
    try:
        shape = shape_for_source(run.model.source)
    except UnknownModel as exc:
        return ["", f"Storage: {exc}"], [], []
    uses = storage_use(cfg, run, shape)
    refused = storage_violations(cfg, run, shape)
    lines = ["", f"Storage of run {run.name} (upper bounds, infra/storage_fit.py):"]
    lines += [f"  {'ok  ' if u.fits else 'FULL'} {u.line()}" for u in uses]
    lines += [f"  refused: {r}" for r in refused]
    document = [{"filesystem": u.name, "mount_path": u.mount_path, "size_gib": u.size_gib, "need_gib": u.need_gib,
                 "fits": u.fits, "needs": [n.model_dump() for n in u.needs]} for u in uses]
    return lines, document, refused


def _time_limits(cfg: StackConfig, run: RunConfig | None, plan: RunPlan | None,
                 environment: EnvironmentPlan | None) -> tuple[list[str], dict[str, Any]]:
    """Each stage's Slurm time limit (sbatch --time) as the run's plan sets it, the environment build's where the
    stack builds one (text lines, JSON)."""
    if run is None or plan is None:
        return [], {}
    cost = plan.cost("train")
    stages = [*(["environment"] if environment else []), *CHAIN, *(serving_stages(cfg, run) if cfg.pipeline.serve else [])]
    limits = {stage: plan.stages[stage].time_limit_minutes for stage in stages}
    basis = train_time_limit(run.time_limits, cost.hours if cost is not None else None)[1]
    lines = ["", "Time limits (sbatch --time; run config time_limits):"]
    lines += [f"  {stage:<12} " + (slurm_duration(limits[stage]) if limits[stage] else "none (runs until stopped)")
              + (f"  ({basis})" if stage == "train" else "") for stage in stages]
    return lines, {"minutes": limits, "train_basis": basis}


def _run_plan(plan: RunPlan | None) -> list[str]:
    """The run's plan as text: each stage's Slurm request, the training placement, serving and the training cost."""
    if plan is None:
        return []
    lines = ["", f"Run plan of {plan.run} on stack {plan.stack} (documents/run_plan.py; --json: run_plan):"]
    lines += [f"  {stage:<12} {' '.join(request.sbatch_args()) or '(no request: one CPU of the local node)'}"
              for stage, request in plan.stages.items()]
    if plan.training is not None:
        t, batches = plan.training, plan.training.batches
        batch = (f"micro-batch {batches.micro_batch_tokens} tokens x {batches.gradient_accumulation_steps}, "
                 f"checkpointing {'on' if batches.gradient_checkpointing else 'off'}" if batches else t.why_not)
        lines.append(f"  training     {t.parallelism.strategy} over {t.nodes} x {t.gpus_per_node} GPU(s), ~"
                     f"{t.parallelism.per_rank_bytes.get('total', 0) / 2**30:.1f} GiB per rank, {batch}")
    if plan.serving is not None:
        lines.append(f"  serving      engine {plan.serving.engine}, --max-lora-rank {plan.serving.max_lora_rank}: "
                     f"{plan.serving.basis}")
    for cost in plan.costs:
        hours = f"{cost.hours:.2f} h, {cost.node_hours:.2f} node-hours" if cost.hours is not None else "hours unknown"
        price = f", ${cost.usd:,.2f}" if cost.usd is not None else ""
        lines.append(f"  {cost.stage:<12} cost {hours}{price} ({cost.basis})")
    return lines + [f"  refused: {reason}" for reason in refusals(plan)]


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, before planning, a chart file that cannot be written: a format other than PNG or SVG, a missing
    folder."""
    path = args.compare_chart
    if path is None:
        return
    if path.suffix not in CHART_SUFFIXES:
        raise SystemExit(f"ftstack plan --compare-chart {path}: the chart is drawn as PNG or SVG; name the file "
                         f"{' or '.join(CHART_SUFFIXES)} (got {path.suffix or 'no suffix'!r})")
    if not path.parent.is_dir():
        raise SystemExit(f"ftstack plan --compare-chart {path}: folder {path.parent} does not exist")


def _comparison(cfg: StackConfig, run: RunConfig | None, inputs: PriceInputs) -> MethodComparison:
    if run is None or run.train is None:
        raise SystemExit(f"ftstack plan --compare: stack {cfg.stack!r}: run config {cfg.pipeline.run_config} has no "
                         "train section here")
    try:
        return compare(cfg, run, inputs)
    except ValueError as exc:
        raise SystemExit(f"ftstack plan --compare: {exc}") from None


def environment_text(section: Environment, plan: EnvironmentPlan) -> str:
    """The environment the first job builds, as the plan shows it."""
    wheels = f"{section.wheels_bytes / 1e9:.2f} GB of wheels" if section.wheels_bytes else "wheel size unknown"
    text = (f"Environment: lock {section.lock_hash} (locks/requirements-{plan.lock}.txt, Python {plan.python_version}, "
            f"{plan.platform}), source {section.source}{' ' + section.image if section.image else ''}, {wheels}; "
            f"built by the first job into {plan.folder}")
    serving = plan.serving
    if serving is None:
        return text
    return (f"{text}\nServing environment: vLLM {serving.vllm_version}, lock {serving.lock_hash} "
            f"(locks/requirements-{serving.lock}.txt, Python {serving.python_version}, {serving.platform}), source "
            f"{serving.source}; built by the first job, when the pipeline serves (pipeline.serve or ftstack run "
            f"--serve), into {serving.folder}; the serve job's FT_VLLM_PYTHON={serving.python}")


def plan_sections(cfg: StackConfig, result: MockRun, args: argparse.Namespace) -> PlanSections:
    inputs = price_inputs(cfg, REPO_ROOT)
    run = load_run(cfg)
    report = price_stack(cfg, inputs, run=run)
    text = ["", render_table(report)]
    document: dict[str, Any] = {"cost": report_document(report)}
    code = 0
    lines, placement = _placement(cfg, run, report.plan)
    text += lines
    if placement:
        document["placement"] = placement
    environment = environment_plan(cfg)
    lines, limits = _time_limits(cfg, run, report.plan, environment)
    text += lines
    if limits:
        document["time_limits"] = limits
    text += _run_plan(report.plan)
    if report.plan is not None:
        document["run_plan"] = report.plan.model_dump(mode="json")
    lines, storage, refused = _storage(cfg, run)
    text += lines
    if storage:
        document["storage"] = storage
    code = 1 if refused else code
    if environment is not None:
        section = environment_section(environment)
        document["environment"] = section.model_dump(mode="json")
        text += ["", environment_text(section, environment)]
    if args.policies:
        results, failed = _plan_check()(result.resources, cfg, run, _policy_config(args.policy_config))
        code = 1 if failed or refused else 0
        document["policies"] = [r.model_dump() for r in results]
        text += ["", f"Policies ({len(results)}, {len(failed)} mandatory violations):"]
        for r in results:
            mark = "pass" if r.passed else ("FAIL" if r.enforcement == "mandatory" else "warn")
            text.append(f"  [{mark}] {r.policy} ({r.enforcement})")
            text += [f"         {v}" for v in r.violations]
            text += [f"         note: {n}" for n in r.notes]
    if args.compare or args.compare_chart:
        comparison = _comparison(cfg, run, inputs)
        document["compare"] = comparison.model_dump()
        text += ["", render_comparison(comparison)]
        if args.compare_chart:
            try:
                plot_comparison(comparison, args.compare_chart)
                text.append(f"chart: {args.compare_chart}")
            except ValueError as exc:
                text.append(f"chart: not drawn: {exc}")
            except OSError as exc:
                raise SystemExit(f"ftstack plan --compare-chart {args.compare_chart}: not written: "
                                 f"{exc.strerror or exc}") from None
    return PlanSections("\n".join(text), document, code)
