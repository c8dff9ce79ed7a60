"""`ftstack plan --stack NAME [--json]`: the stack's resource tree from an offline run under mocks.

No Pulumi CLI, cloud credentials or network are needed: the program runs against mocks of the
Nebius and Kubernetes APIs. Ids and addresses in the output are therefore placeholders; use
`pulumi preview --stack NAME` for a plan against the real cloud.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from documents.run_config import ConfigError, load_run_config
from infra.commands import plan_sections
from infra.config import REPO_ROOT, StackConfig, StackConfigError, load_run, load_stack_config
from infra.cost.price import measured_plan
from infra.environment.lock import LockError
from infra.environment.plan import check_stack_lock
from infra.pipeline.ceilings import RunCeilingError, check_run_ceilings
from infra.pipeline.chain import check_run_config_path
from planning.planner import PlanRefused, check_plan
from planning.time_limits import TimeLimitError, train_time_limit
from infra.run_sources import check_stack_run
from infra.runs.measured import price_inputs
from infra.program.mocks import MockResource, MockRun, run_under_mocks
from infra.commands import manifests
from infra.soperator.helm_render import HelmRenderError

_KEY_PROPERTIES = (
    "name", "platform", "preset", "fixedNodeCount", "autoscaling", "type", "sizeGibibytes",
    "forbidDeletion", "infinibandFabric", "chart", "version", "namespace", "versioningPolicy",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="offline plan: the stack's resources and outputs from a run under mocks (no cloud access)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<stack>.yaml)")
    parser.add_argument("--config-dir", default="stacks", help="directory of the stack files (default: stacks)")
    parser.add_argument("--json", action="store_true", help="print resources and outputs as JSON")
    parser.add_argument("--run-config", metavar="FILE",
                        help="plan with this run config instead of the stack's pipeline.runConfig (a path under "
                             "workloads/, relative to the repository root, as pipeline.runConfig takes it)")
    plan_sections.add_arguments(parser)
    manifests.add_arguments(parser)
    parser.set_defaults(func=run)


def key_properties(resource: MockResource) -> dict[str, Any]:
    """The few inputs that say what a resource is (secrets stay redacted)."""
    inputs = resource.inputs
    props: dict[str, Any] = {}
    template = inputs.get("template", {})
    for source in (inputs, template.get("resources", {}), inputs.get("controlPlane", {})):
        props.update({k: v for k, v in source.items() if k in _KEY_PROPERTIES and k not in props})
    if "bootDisk" in template:
        disk = template["bootDisk"]
        props["bootDisk"] = f"{disk.get('sizeGibibytes')} GiB {disk.get('type')}"
    if template.get("filesystems"):
        props["mountTags"] = [f["mountTag"] for f in template["filesystems"]]
    if resource.protect:
        props["protect"] = True
    return props


def plan_document(run: MockRun) -> dict[str, Any]:
    return {
        "resources": [
            {"type": r.type, "name": r.name, "parent": r.parent, "properties": key_properties(r)}
            for r in run.resources
        ],
        "outputs": run.outputs,
    }


def _format_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def render_tree(run: MockRun) -> str:
    children: dict[str | None, list[MockResource]] = {}
    for resource in run.resources:
        children.setdefault(resource.parent, []).append(resource)
    urns = {r.urn for r in run.resources}
    lines: list[str] = []

    def walk(resource: MockResource, depth: int) -> None:
        props = ", ".join(f"{k}={_format_value(v)}" for k, v in key_properties(resource).items())
        lines.append(f"{'  ' * depth}{resource.type}  {resource.name}" + (f"  [{props}]" if props else ""))
        for child in sorted(children.get(resource.urn, []), key=lambda r: r.name):
            walk(child, depth + 1)

    for resource in run.resources:
        if resource.parent not in urns:
            walk(resource, 0)
    return "\n".join(lines)


def render_text(stack_name: str, run: MockRun) -> str:
    head = f"Offline plan of stack {stack_name!r} (mocked cloud; `pulumi preview --stack {stack_name}` for the real one)"
    tree = render_tree(run) or "(no cloud resources)"
    outputs = "\n".join(f"  {k} = {_format_value(v)}" for k, v in run.outputs.items())
    return f"{head}\n\nResources ({len(run.resources)}):\n{tree}\n\nOutputs:\n{outputs}\n"


def with_run_config(cfg: StackConfig, path: str) -> StackConfig:
    """The stack with `path` as its pipeline.runConfig, checked as the pipeline checks it (shipped, readable)."""
    try:
        check_run_config_path(path)
    except ValueError as exc:
        raise ConfigError(f"--run-config: {exc}") from None
    load_run_config(REPO_ROOT / path)
    return cfg.model_copy(update={"pipeline": cfg.pipeline.model_copy(update={"run_config": path})})


def check_ceilings(cfg: StackConfig) -> None:
    """Refuse, before the program plans its jobs, a training run over the stack's cost or time ceiling, one whose
    estimate asks for a Slurm time limit past a year (ceilings raised that far), or a plan the planner refuses (an
    adapter rank the serving engine's configured limit cannot take)."""
    run_config = load_run(cfg)
    if run_config is None:
        return
    plan = measured_plan(cfg, price_inputs(cfg, REPO_ROOT), run_config)
    training = plan.cost("train")
    if training is not None:
        check_run_ceilings(cfg.pipeline, run_config.name, training.hours, training.usd)
        train_time_limit(run_config.time_limits, training.hours)
    check_plan(plan)


def run(args: argparse.Namespace) -> int:
    plan_sections.check_arguments(args)
    try:
        cfg = load_stack_config(args.stack, args.config_dir)
    except StackConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        if args.run_config:
            cfg = with_run_config(cfg, args.run_config)
        check_stack_lock(cfg)
        check_stack_run(cfg)
        check_ceilings(cfg)
        result = run_under_mocks(cfg)
    except (HelmRenderError, ConfigError, LockError, RunCeilingError, TimeLimitError, PlanRefused) as exc:
        print(f"ftstack plan: {exc}", file=sys.stderr)
        return 2
    sections = plan_sections.plan_sections(cfg, result, args)
    try:
        written = manifests.write_manifests(cfg, result, args.manifests) if args.manifests else None
    except HelmRenderError as exc:
        print(f"ftstack plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan_document(result) | sections.document, indent=2))
    else:
        print(render_text(args.stack, result))
        print(sections.text)
    if written is not None:
        print(manifests.manifests_text(written), file=sys.stderr if args.json else sys.stdout)
    return sections.exit_code
