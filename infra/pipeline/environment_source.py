"""EnvironmentSource: the lock (and for the wheelhouse source, the wheels) shipped to `<env root>/sources/<key>`,
once per key, before the `environment` stage builds from it. Like the code bundle, a dynamic resource of the
program and a plain call of `ftstack run`; a lock with no wheel for the cluster is refused here, before any job."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from infra.environment.lock import PURE_SDISTS, TARGETS, normalize, refuse_wheel_gaps
from infra.environment.plan import EnvironmentPlan, ServingEnvironmentPlan, lock_target
from infra.environment.source import SOURCE_SPEC, stage_source
from infra.pipeline.connect import open_transport
from infra.pipeline.transport import Transport
from infra.dynamic_resource import DynamicResource

WHEELHOUSE_CACHE = ".local/wheelhouse"


def check_wheels(plan: EnvironmentPlan) -> None:
    """Every package of the workloads' lock has a wheel for the cluster's Python and platform (uv's choice in the
    PEP 751 lock), pure-Python sdists excepted; else LockError naming the package and the platform."""
    target = TARGETS[plan.lock]
    packages = tomllib.loads(target.pylock.read_text())["packages"]
    refuse_wheel_gaps([f"{p['name']} {p['version']}" for p in packages
                       if not p.get("wheels") and normalize(p["name"]) not in PURE_SDISTS], target)


def _ship(transport: Transport, plan: EnvironmentPlan | ServingEnvironmentPlan, repo_root: Path) -> bool:
    """Upload one environment's source folder unless the cluster has it already; whether it was sent."""
    if transport.run(["test", "-f", f"{plan.source_dir}/{SOURCE_SPEC}"], timeout=60).ok:
        return False
    with tempfile.TemporaryDirectory(prefix="ft-env-") as tmp:
        stage_source(lock_target(plan.lock), plan.source, Path(tmp) / "source",
                     cache_root=repo_root / WHEELHOUSE_CACHE, image=plan.image)
        transport.run(["mkdir", "-p", f"{plan.root}/sources"], timeout=60).check()
        transport.put_directory(Path(tmp) / "source", plan.source_dir, replace=True)
    return True


def ship_source(transport: Transport, plan: EnvironmentPlan, repo_root: Path, serve: bool = False) -> dict[str, Any]:
    """Upload the source folder unless the cluster has it already, and the serving environment's too when the chain
    serves (`serve`) on a stack that has one; returns their paths and whether the first was sent."""
    check_wheels(plan)
    shipped = _ship(transport, plan, repo_root)
    serving = plan.serving if serve else None
    if serving is not None:
        _ship(transport, serving, repo_root)
    return {"source_dir": plan.source_dir, "shipped": shipped,
            "serving_source_dir": serving.source_dir if serving else None}


class EnvironmentSourceProvider(ResourceProvider):
    """Inputs: plan (EnvironmentPlan as a dict), repo_root, transport (spec, see open_transport), serve (ship the
    serving environment's source too)."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = ship_source(open_transport(props["transport"]), EnvironmentPlan(**props["plan"]),
                           Path(props["repo_root"]), bool(props.get("serve")))
        return CreateResult(id_=props["plan"]["key"], outs={**props, **outs})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in ("plan", "transport", "serve") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=[], delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        outs = ship_source(open_transport(news["transport"]), EnvironmentPlan(**news["plan"]),
                           Path(news["repo_root"]), bool(news.get("serve")))
        return UpdateResult(outs={**news, **outs})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Keeps what was shipped: an environment built from it may be in use."""


class EnvironmentSource(DynamicResource):
    """The shipped lock on the cluster; output source_dir."""

    source_dir: pulumi.Output[str]

    def __init__(self, name: str, *, plan: EnvironmentPlan, repo_root: str, transport: pulumi.Input[dict],
                 serve: bool = False, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(
            EnvironmentSourceProvider(), name,
            {"plan": plan.model_dump(), "repo_root": repo_root, "transport": transport, "serve": serve,
             "source_dir": None, "shipped": None, "serving_source_dir": None},
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["transport"])),
        )
