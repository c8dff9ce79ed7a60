"""The cost table and policy results that `ftstack plan` adds after the resource tree.

`--policies` runs policies/rules.py against the run under mocks; a mandatory violation makes the plan
exit 1. `--policy-config FILE.json` takes the format of `pulumi preview --policy-pack-config`:
``{"<policy>": {"enforcementLevel": "advisory", "<property>": value}}``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from infra.config import StackConfig
from infra.cost.report import cost_report, load_run, render_table, report_document
from infra.program.mocks import MockRun


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policies", action="store_true",
                        help="run the policy pack's rules; exit 1 on a mandatory violation")
    parser.add_argument("--policy-config", type=Path, help="policy config JSON (as for pulumi --policy-pack-config)")


@dataclass(frozen=True)
class PlanExtras:
    text: str
    document: dict[str, Any]
    exit_code: int


def _policy_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
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


def plan_extras(cfg: StackConfig, result: MockRun, args: argparse.Namespace) -> PlanExtras:
    report = cost_report(cfg)
    text = ["", render_table(report)]
    document: dict[str, Any] = {"cost": report_document(report)}
    code = 0
    if args.policies:
        results, failed = _plan_check()(result.resources, cfg, load_run(cfg), _policy_config(args.policy_config))
        code = 1 if failed else 0
        document["policies"] = [r.model_dump() for r in results]
        text += ["", f"Policies ({len(results)}, {len(failed)} mandatory violations):"]
        for r in results:
            mark = "pass" if r.passed else ("FAIL" if r.enforcement == "mandatory" else "warn")
            text.append(f"  [{mark}] {r.policy} ({r.enforcement})")
            text += [f"         {v}" for v in r.violations]
    return PlanExtras("\n".join(text), document, code)
