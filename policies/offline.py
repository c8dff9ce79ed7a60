"""The pack's rules over an offline plan (`ftstack plan --policies`).

ftstack finds this function through the `ftstack.plan_checks` entry point (pyproject.toml), so the
dependency runs one way only: policies import infra, infra never imports policies.
"""

from __future__ import annotations

from typing import Any

from infra.config import StackConfig
from policies.rules import Res, Result, evaluate, mandatory_failures


def check_plan(resources: list[Any], cfg: StackConfig, run: Any | None,
               policy_config: dict[str, Any]) -> tuple[list[Result], list[Result]]:
    """Every policy's result for the mock run's resources, and the mandatory violations among them."""
    results = evaluate([Res.from_mock(r) for r in resources], cfg, run, policy_config)
    return results, mandatory_failures(results)
