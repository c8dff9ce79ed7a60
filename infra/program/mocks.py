"""Run the Pulumi program offline: Nebius and Kubernetes answered by mocks, everything recorded.

Used by the tests and by ``ftstack plan``. Each run gets a fresh context (its own root stack,
config and settings), so runs do not leak into one another.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import config as runtime_config
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func, wait_for_rpcs
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from infra.config import PROJECT, StackConfig
from infra.program.build import build_stack

SECRET = "[secret]"
MOCK_ENDPOINT = "https://mk8s-endpoint.mock.invalid:443"
MOCK_CA = "-----BEGIN CERTIFICATE-----\nbW9jaw==\n-----END CERTIFICATE-----\n"
MOCK_LOGIN_CIDR = "203.0.113.10/32"
GIB = 1024**3


@dataclass
class MockResource:
    """One registered resource as the engine would see it."""

    type: str
    name: str
    urn: str
    parent: str | None
    custom: bool
    protect: bool
    dependencies: list[str]
    inputs: dict[str, Any]
    """Inputs with every secret replaced by ``[secret]``."""


@dataclass
class MockRun:
    resources: list[MockResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    """Stack outputs; secret ones are ``[secret]``."""
    secret_outputs: set[str] = field(default_factory=set)

    def of_type(self, type_: str) -> list[MockResource]:
        return [r for r in self.resources if r.type == type_]

    def by_name(self, name: str) -> MockResource:
        return next(r for r in self.resources if r.name == name)

    def by_urn(self, urn: str) -> MockResource:
        return next(r for r in self.resources if r.urn == urn)


def redact(value: Any) -> Any:
    """A wire-format value with every secret replaced by ``[secret]`` (and whole floats as ints)."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return SECRET
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


DYNAMIC = "pulumi-python:dynamic:Resource"


class NebiusMocks(pulumi.runtime.Mocks):
    """Answers like the Nebius API would: ids, plus the status fields the program reads. As a preview of
    a stack with nothing created yet (``preview``): no id and no computed field, so they are unknown."""

    def __init__(self, preview: bool = False):
        self.preview = preview

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        state = dict(args.inputs)
        kind = args.typ.rsplit(":", 1)[-1]
        if self.preview:
            return "", state
        if kind == "Mk8sV1Cluster":
            state["status"] = {"controlPlane": {
                "endpoints": {"publicEndpoint": MOCK_ENDPOINT},
                "auth": {"clusterCaCertificate": MOCK_CA},
                "version": args.inputs.get("controlPlane", {}).get("version"),
            }}
        elif kind == "VpcV1Allocation":
            state["status"] = {"details": {"allocatedCidr": MOCK_LOGIN_CIDR}}
        elif kind == "ComputeV1Filesystem":
            state["status"] = {"sizeBytes": float(args.inputs.get("sizeGibibytes", 0)) * GIB}
        elif kind == "Release":
            state["status"] = {"status": "deployed", "version": args.inputs.get("version")}
        elif args.typ == DYNAMIC and "script" in args.inputs:
            state.update(job_id=f"{args.name}-job", state="PENDING")
        elif args.typ == DYNAMIC and "content_hash" in args.inputs:
            state["path"] = f"{args.inputs['code_root']}/{args.inputs['content_hash']}"
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list]:
        kind = args.token.rsplit(":", 1)[-1]
        result = {"id": args.args.get("id") or f"{kind}-{args.args.get('name', 'found')}-id"}
        if kind == "getComputeV1Filesystem":
            result["status"] = {"sizeBytes": 1024.0 * GIB}
        return result, []


class RecordingMonitor(MockMonitor):
    """The mock engine, also keeping parent, protect and dependencies of each registration."""

    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.recorded: list[MockResource] = []

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.recorded.append(MockResource(
                type=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent or None,
                custom=request.custom,
                protect=bool(request.protect),
                dependencies=list(request.dependencies),
                inputs=redact(json_format.MessageToDict(request.object)),
            ))
        return response


def _config_values(cfg: StackConfig) -> dict[str, str]:
    dumped = cfg.model_dump(by_alias=True, exclude={"stack"}, exclude_none=True)
    return {
        f"{PROJECT}:{key}": value if isinstance(value, str) else json.dumps(value)
        for key, value in dumped.items()
    }


async def _resolve_all(values: dict[str, Any]) -> dict[str, tuple[Any, bool]]:
    """Every value's result and whether it is secret, awaited together: one pump of the event loop for all of them
    (each `_sync_await` inside the program pumps it again; one per output took 10 of a run's 13 s)."""
    outputs = [pulumi.Output.from_input(value) for value in values.values()]
    results = await asyncio.gather(*(output.future() for output in outputs))
    secrets = await asyncio.gather(*(output.is_secret() for output in outputs))
    return dict(zip(values, zip(results, secrets)))


def _run(cfg: StackConfig, secrets: dict[str, str], preview: bool) -> MockRun:
    # `set_mocks` makes the root stack's futures on the thread's current loop without ensuring one: after
    # `asyncio.run` (which leaves none) it failed with "There is no current event loop". Pulumi's own helper sets one,
    # left open and current: a loop closed after a run hangs the next run on that run's pending calls.
    _ensure_event_loop()
    monitor = RecordingMonitor(NebiusMocks(preview))
    config = _config_values(cfg) | {f"{PROJECT}:{k}": v for k, v in secrets.items()}
    runtime_config.set_all_config(config, [f"{PROJECT}:{k}" for k in secrets])
    pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT, stack=cfg.stack, preview=preview, monitor=monitor)
    run = MockRun()

    def program() -> None:
        for key, (resolved, secret) in _sync_await(_resolve_all(build_stack(cfg).flat())).items():
            run.outputs[key] = SECRET if secret else resolved
            if secret:
                run.secret_outputs.add(key)

    _sync_await(run_pulumi_func(program))
    _sync_await(wait_for_rpcs())
    run.resources = monitor.recorded
    return run


def run_under_mocks(cfg: StackConfig, secrets: dict[str, str] | None = None, *, preview: bool = False) -> MockRun:
    """Run ``build_stack(cfg)`` against the mocks and record it: by default an update (outputs known);
    with ``preview`` a first preview (ids and computed outputs unknown, recorded as Pulumi's unknown sentinel).

    ``secrets`` are set as secret config values of the project namespace, as ``secure:`` values are.
    """
    return contextvars.Context().run(_run, cfg, dict(secrets or {}), preview)
