"""The CrossGuard policy pack: `pulumi preview --policy-pack policies`. Only builds the pack; the rules
live in policies/rules.py. Importing this module starts the analyzer server (that is how packs run)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pulumi_policy import (  # noqa: E402
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.config import from_pulumi_config, load_run, load_stack_config  # noqa: E402
from policies import rules  # noqa: E402
from policies.analyzer_secrets import keep_secrets_secret  # noqa: E402


def _stack_config():
    try:
        return from_pulumi_config()
    except Exception:  # the CLI did not hand the stack's config to the analyzer: read the stack file
        return load_stack_config(os.environ["PULUMI_STACK"], ROOT / "stacks")


PRICED: dict = {}
"""The stack's price, computed by the first policy that needs it (one preview is one stack)."""


def _validator(spec: rules.PolicySpec):
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        cfg = _stack_config()
        resources = [rules.Res.from_policy(r) for r in args.resources]
        config = rules.defaults(spec) | dict(args.get_config())
        ctx = rules.Context(resources, cfg, load_run(cfg), config, priced=PRICED)
        for message in spec.check(ctx):
            report_violation(message, None)
        for note in sorted(set(ctx.unchecked)):  # shown in the preview's diagnostics, not a violation
            print(f"policy {spec.name}: not checked: {note}", file=sys.stderr)
        for note in ctx.notes:
            print(f"policy {spec.name}: {note}", file=sys.stderr)

    return validate


keep_secrets_secret()
PolicyPack(
    name="soperator-finetune",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[
        StackValidationPolicy(
            name=spec.name,
            description=spec.description,
            validate=_validator(spec),
            enforcement_level=EnforcementLevel(spec.enforcement),
            config_schema=PolicyConfigSchema(properties=dict(spec.config_schema)) if spec.config_schema else None,
        )
        for spec in rules.POLICIES
    ],
)
