"""The policy pack served as `pulumi preview --policy-pack policies` serves it: this test plays the engine.

How the CLI (pulumi 3.272, locks/) starts a Python pack: since pulumi/pulumi#21684 the Python language host's
RunPlugin does what the `pulumi-analyzer-policy-python` shim did (sdk/python/cmd/pulumi-language-python/main.go):
the pack's PulumiPolicy.yaml `virtualenv` (joined to the pack folder) gives the interpreter, the environment is
that virtualenv activated (sdk/python/toolchain: PATH, VIRTUAL_ENV, no PYTHONHOME), the command is
`python -u -m pulumi.policy <engine address> <pack folder>` run in the pack folder, with PULUMI_ORGANIZATION,
PULUMI_PROJECT, PULUMI_STACK, PULUMI_DRY_RUN and PULUMI_CONFIG (the stack's decrypted config as JSON) from the
engine's ConfigureStack; the port comes on stdout's first line (sdk/policy_proxy.go). The engine then calls
Handshake (Unimplemented is fine), ConfigureStack, GetAnalyzerInfo, Configure (each policy's level and its config
schema's defaults under the --policy-pack-config file: pkg/engine/update.go loadPolicyPlugins,
ReconcilePolicyPackConfig), Analyze with each resource's inputs and AnalyzeStack with every resource's outputs
(pkg/resource/deploy/step_generator.go), properties marshalled with KeepUnknowns, KeepSecrets and
SkipInternalKeys (sdk/go/common/resource/plugin/rpc.go: unknowns as sentinel strings, secrets under the secret
signature, top-level `__` keys dropped). A first preview's resources come from the program under the mocks
(`preview=True`: ids and computed outputs unknown); their outputs are their inputs, as the mocks answer.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc, engine_pb2_grpc

from infra.config import PROJECT, load_stack_config
from infra.program import mocks

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / "policies"
STACKS = ["dev", "demo", "h100", "local"]
# what `pulumi config set --secret pipelineSshPrivateKey < ~/.ssh/id_ed25519` stores (a made-up key of that shape)
KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
       "-----END OPENSSH PRIVATE KEY-----\n")
SECRET_KEY = f"{PROJECT}:pipelineSshPrivateKey"
# docs/cost-and-policies.md, "Policies": every policy, all mandatory, with its config and default
POLICIES = {
    "filesystem-quota": {"maxTotalGib": ("number", 5120)},
    "monthly-budget": {"maxMonthlyUsd": ("number", 50000)},
    "preset-exists": {}, "gpu-workers-gpu-preset": {}, "model-fits-gpu": {}, "run-plan-accepted": {},
    "storage-fits": {},
    "login-only-public": {},
    "data-filesystems-protected": {"exemptStacks": ("array", ["dev"])},
    "jail-backed-up": {"exemptStacks": ("array", ["dev"])},
    "artifacts-versioned": {}, "preemptible-needs-resume": {}, "no-plain-secrets": {},
}


def _stack_config(stack: str) -> dict[str, str]:
    """The stack's config as the engine hands it to a pack: `project:key` -> string (objects as JSON)."""
    config = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
    return values | ({SECRET_KEY: KEY} if _uses_key(stack) else {})


def _uses_key(stack: str) -> bool:
    return load_stack_config(stack, ROOT / "stacks").target != "local"


def _engine_struct(sent: struct_pb2.Struct) -> struct_pb2.Struct:
    """The properties the program sent, as the engine marshals them for an analyzer: the Python SDK's wire
    encoding (unknowns as rpc.UNKNOWN, secrets under the secret signature) is the engine's; top-level internal
    keys (`__provider` of a dynamic resource) are skipped."""
    out = struct_pb2.Struct()
    for key in sent.fields:
        if not key.startswith("__"):
            out.fields[key].CopyFrom(sent.fields[key])
    return out


def previewed(stack: str, first: bool = True) -> list[analyzer_pb2.AnalyzerResource]:
    """Every resource of a `pulumi preview` of the stack, as AnalyzeStack carries it: its first (nothing created:
    ids and computed outputs unknown) or one after `pulumi up` (outputs known, as the mocks answer an update)."""
    sent: dict[str, Any] = {}

    class WireMonitor(mocks.RecordingMonitor):
        def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
            response = super().RegisterResource(request)
            sent[response.urn] = request.object
            return response

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mocks, "RecordingMonitor", WireMonitor)
        cfg = load_stack_config(stack, ROOT / "stacks")
        run = mocks.run_under_mocks(cfg, {"pipelineSshPrivateKey": KEY} if _uses_key(stack) else {},
                                   preview=first)
    return [analyzer_pb2.AnalyzerResource(
        type=r.type, name=r.name, urn=r.urn, properties=_engine_struct(sent[r.urn]), parent=r.parent or "",
        dependencies=r.dependencies, options=analyzer_pb2.AnalyzerResourceOptions(protect=r.protect,
                                                                                 parent=r.parent or ""),
    ) for r in run.resources]


def _activated(venv: Path) -> dict[str, str]:
    """os.environ with the virtualenv activated as pulumi's toolchain.ActivateVirtualEnv does."""
    env = {k: v for k, v in os.environ.items() if k.upper() not in {"PYTHONHOME", "VIRTUAL_ENV"}}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}" if "PATH" in env else str(venv / "bin")
    return env | {"VIRTUAL_ENV": str(venv)}


@contextmanager
def started_pack(stack: str, log: Path) -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """The pack started as the CLI's Python language host starts it, for a preview of `stack`."""
    options = yaml.safe_load((PACK / "PulumiPolicy.yaml").read_text())["runtime"]["options"]
    venv = Path(os.path.normpath(PACK / options["virtualenv"]))
    engine = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    engine_pb2_grpc.add_EngineServicer_to_server(engine_pb2_grpc.EngineServicer(), engine)
    engine_port = engine.add_insecure_port("127.0.0.1:0")
    engine.start()
    env = _activated(venv) | {"PULUMI_ORGANIZATION": "organization", "PULUMI_PROJECT": PROJECT,
                              "PULUMI_STACK": stack, "PULUMI_DRY_RUN": "true",
                              "PULUMI_CONFIG": json.dumps(_stack_config(stack))}
    with log.open("wb") as stderr:
        pack = subprocess.Popen([str(venv / "bin" / "python"), "-u", "-m", "pulumi.policy",
                                 f"127.0.0.1:{engine_port}", str(PACK)],
                                cwd=PACK, env=env, stdout=subprocess.PIPE, stderr=stderr)
    try:
        port = pack.stdout.readline().decode().strip()
        assert port.isdigit(), f"the pack printed no port: {log.read_text()[-3000:]}"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        pack.terminate()
        pack.wait(timeout=60)
        engine.stop(None)


def configure(analyzer, stack: str, policy_config: dict[str, dict] | None = None) -> analyzer_pb2.AnalyzerInfo:
    """The engine's calls before the preview's resources: handshake, stack, info, reconciled policy config."""
    with pytest.raises(grpc.RpcError) as handshake:
        analyzer.Handshake(analyzer_pb2.AnalyzerHandshakeRequest(engine_address="127.0.0.1:0",
                                                                 root_directory=str(PACK),
                                                                 program_directory=str(PACK)))
    assert handshake.value.code() == grpc.StatusCode.UNIMPLEMENTED  # the engine falls back, as it does
    analyzer.ConfigureStack(analyzer_pb2.AnalyzerStackConfigureRequest(
        stack=stack, project=PROJECT, organization="organization", dry_run=True, config=_stack_config(stack),
        config_secret_keys=[SECRET_KEY] if _uses_key(stack) else []))
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    request = analyzer_pb2.ConfigureAnalyzerRequest()
    for policy in info.policies:
        own = dict((policy_config or {}).get(policy.name, {}))
        level = own.pop("enforcementLevel", analyzer_pb2.EnforcementLevel.Name(policy.enforcementLevel).lower())
        defaults = {k: v["default"] for k, v in json_format.MessageToDict(policy.configSchema.properties).items()}
        request.policyConfig[policy.name].enforcementLevel = analyzer_pb2.EnforcementLevel.Value(level.upper())
        request.policyConfig[policy.name].properties.update(defaults | own)
    analyzer.Configure(request)
    return info


def preview(analyzer, resources: list[analyzer_pb2.AnalyzerResource]) -> list[analyzer_pb2.AnalyzeDiagnostic]:
    """Analyze for each resource (the pack has only stack policies: nothing to say), then AnalyzeStack."""
    for r in resources:
        response = analyzer.Analyze(analyzer_pb2.AnalyzeRequest(type=r.type, properties=r.properties, urn=r.urn,
                                                                name=r.name, options=r.options))
        assert list(response.diagnostics) == [], r.name
    return list(analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources)).diagnostics)


def test_the_pack_describes_itself_as_documented(tmp_path):
    with started_pack("demo", tmp_path / "pack.log") as analyzer:
        info = configure(analyzer, "demo")
    assert info.name == "soperator-finetune" and info.supportsConfig
    assert [p.name for p in info.policies] == list(POLICIES)
    for policy in info.policies:
        assert policy.enforcementLevel == analyzer_pb2.MANDATORY, policy.name
        assert policy.policy_type == analyzer_pb2.POLICY_TYPE_STACK, policy.name
        schema = json_format.MessageToDict(policy.configSchema.properties)
        assert {k: (v["type"], v["default"]) for k, v in schema.items()} == POLICIES[policy.name], policy.name


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_passes_every_policy_on_its_first_preview_and_after_up(tmp_path, stack):
    first, after_up = previewed(stack), previewed(stack, first=False)
    known = {r.name: json_format.MessageToDict(r.properties) for r in after_up}
    secret = [name for name, props in known.items() if rpc._special_secret_sig in json.dumps(props)]
    assert bool(secret) == _uses_key(stack), "the pipeline's key reaches the engine as a secret"
    with started_pack(stack, tmp_path / "pack.log") as analyzer:
        configure(analyzer, stack)
        assert [(d.policyName, d.message) for d in preview(analyzer, first)] == []
        assert [(d.policyName, d.message) for d in preview(analyzer, after_up)] == []
    log = (tmp_path / "pack.log").read_text()
    if stack != "local":  # a new cluster's id is unknown on the first preview: the rules say what they skipped
        assert "policy no-plain-secrets: not checked:" in log and "unknown value(s) not scanned" in log, log[-2000:]
    assert KEY.splitlines()[1] not in log


def _with_props(resources, name: str, **props) -> list[analyzer_pb2.AnalyzerResource]:
    out = []
    for r in resources:
        if r.name == name:
            r = analyzer_pb2.AnalyzerResource.FromString(r.SerializeToString())
            r.properties.update(props)
        out.append(r)
    return out


def test_a_violating_preview_gets_each_violation_at_its_level(tmp_path):
    resources = previewed("demo", first=False)
    big = _with_props(resources, "innovationbank-fs-jail-submount-data", sizeGibibytes=8192)
    bundle = next(r for r in resources if r.name == "innovationbank-pipeline-bundle")
    transport = json_format.MessageToDict(bundle.properties)["transport"]["value"]  # unwrapped: sent in plain text
    leaky = _with_props(big, bundle.name, transport=transport)
    config = {"monthly-budget": {"maxMonthlyUsd": 1000, "enforcementLevel": "advisory"}}
    with started_pack("demo", tmp_path / "pack.log") as analyzer:
        configure(analyzer, "demo", config)
        diagnostics = {d.policyName: d for d in preview(analyzer, leaky)}
    assert sorted(diagnostics) == ["filesystem-quota", "monthly-budget", "no-plain-secrets"]
    assert diagnostics["filesystem-quota"].enforcementLevel == analyzer_pb2.MANDATORY
    assert "exceeds the quota of 5,120 GiB" in diagnostics["filesystem-quota"].message
    assert diagnostics["monthly-budget"].enforcementLevel == analyzer_pb2.ADVISORY
    assert "exceeds the budget $1,000" in diagnostics["monthly-budget"].message
    assert diagnostics["no-plain-secrets"].enforcementLevel == analyzer_pb2.MANDATORY
    assert f"resource {bundle.name} property transport.private_key" in diagnostics["no-plain-secrets"].message
