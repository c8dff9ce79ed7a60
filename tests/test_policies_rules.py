"""Every policy passes on the shipped stacks (resources from their run under mocks) and fails on a crafted bad one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.config import load_stack_config
from infra.config import load_run
from infra.program.mocks import run_under_mocks
from policies import rules
from policies.rules import Context, Res, evaluate, mandatory_failures

ROOT = Path(__file__).resolve().parent.parent
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))


@pytest.fixture(scope="module")
def mocked():
    cache: dict[str, tuple] = {}

    def get(stack: str):
        if stack not in cache:
            cfg = load_stack_config(stack, ROOT / "stacks")
            cache[stack] = (cfg, [Res.from_mock(r) for r in run_under_mocks(cfg).resources])
        return cache[stack]

    return get


def _ctx(mocked, stack="demo", resources=None, cfg=None, run=None, **config):
    base_cfg, base_res = mocked(stack)
    return Context(resources if resources is not None else base_res, cfg or base_cfg, run, config)


def _replace(resources, name, **changes):
    out = []
    for r in resources:
        if r.name == name:
            props = {**r.props, **changes.pop("props", {})}
            r = r.model_copy(update={"props": props, **changes})
        out.append(r)
    return out


def _with_train(run, **train):
    return run.model_copy(update={"train": run.train.model_copy(update=train)})


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_pass_every_policy(mocked, stack):
    cfg, resources = mocked(stack)
    results = evaluate(resources, cfg, load_run(cfg, ROOT))
    assert [r.policy for r in results] == [p.name for p in rules.POLICIES]
    assert all(r.passed for r in results), [r for r in results if not r.passed]


def test_filesystem_quota_seed_001(mocked):
    _, resources = mocked("demo")
    big = _replace(resources, "innovationbank-fs-jail-submount-data", props={"sizeGibibytes": 3072})
    [message] = rules.filesystem_quota(_ctx(mocked, resources=big))
    assert "6,016 GiB exceeds the quota of 5,120 GiB" in message
    assert rules.filesystem_quota(_ctx(mocked, resources=big, maxTotalGib=8192)) == []


def test_monthly_budget(mocked):
    # the demo stack with monitoring: seed 000's $18,958 plus $82.72 of monitoring
    assert rules.monthly_budget(_ctx(mocked, maxMonthlyUsd=19_100)) == []
    [message] = rules.monthly_budget(_ctx(mocked, maxMonthlyUsd=19_000))
    assert "$19,041" in message


def test_presets_and_gpu_workers(mocked):
    _, resources = mocked("demo")
    template = next(r for r in resources if r.name == "innovationbank-worker").props["template"]
    bad_preset = _replace(resources, "innovationbank-worker",
                          props={"template": {**template, "resources": {"platform": "gpu-l40s-d", "preset": "8gpu-1vcpu-1gb"}}})
    assert "8gpu-1vcpu-1gb" in rules.presets_exist(_ctx(mocked, resources=bad_preset))[0]
    cpu_worker = _replace(resources, "innovationbank-worker",
                          props={"template": {**template, "resources": {"platform": "cpu-d3", "preset": "8vcpu-32gb"}}})
    assert rules.presets_exist(_ctx(mocked, resources=cpu_worker)) == []
    assert "has no GPU" in rules.gpu_workers_have_gpu_presets(_ctx(mocked, resources=cpu_worker))[0]


def test_model_fits_qlora_but_not_unquantized_without_checkpointing_on_l40s(mocked):
    cfg, _ = mocked("demo")
    run = load_run(cfg, ROOT)
    qlora = _with_train(run, method="qlora", quantization="4bit", micro_batch_size=2, gradient_checkpointing=True)
    heavy = _with_train(run, method="lora", quantization="none", micro_batch_size=4, gradient_checkpointing=False)
    assert run.model.source == "hub:Qwen/Qwen3-14B"
    assert rules.model_fits(_ctx(mocked, run=qlora)) == []
    [message] = rules.model_fits(_ctx(mocked, run=heavy))
    assert "lora of hub:Qwen/Qwen3-14B" in message and "44.99 GiB usable" in message
    assert rules.model_fits(_ctx(mocked, "h100", run=heavy)), "bf16 LoRA of 14B at micro-batch 4 without checkpointing exceeds 79.19 GiB too"


def test_run_plan_accepted_refuses_a_rank_the_set_serving_limit_cannot_take(mocked):
    """h100.json with train.lora.r 32 under serve.max_lora_rank 16 fails the policy naming both ranks (the refusal
    `ftstack plan` and the chain make, test_run_plan); the shipped rank passes with the engine's limit as a note."""
    cfg, _ = mocked("h100")
    run = load_run(cfg, ROOT)
    ctx = _ctx(mocked, "h100", run=run)
    assert rules.plan_accepted(ctx) == []
    assert any("--max-lora-rank" in note for note in ctx.notes), ctx.notes
    lora = run.train.lora.model_copy(update={"r": 32})
    serve = run.serve.model_copy(update={"max_lora_rank": 16})
    over = run.model_copy(update={"train": run.train.model_copy(update={"lora": lora}), "serve": serve})
    [message] = rules.plan_accepted(_ctx(mocked, "h100", run=over))
    assert "LoRA rank 32 is over serve.max_lora_rank 16" in message, message


def test_login_access(mocked):
    cfg, resources = mocked("demo")
    assert "SSH public key" in rules.login_access(_ctx(mocked, cfg=cfg.model_copy(update={"ssh_public_keys": []})))[0]
    template = next(r for r in resources if r.name == "innovationbank-worker").props["template"]
    public = {**template, "networkInterfaces": [{"subnetId": "s", "publicIpAddress": {}}]}
    exposed = _replace(resources, "innovationbank-worker", props={"template": public})
    assert "innovationbank-worker: has a public IP" in rules.login_access(_ctx(mocked, resources=exposed))[0]
    extra_ip = resources + [Res(type=rules.ALLOCATION, name="innovationbank-worker-ip", props={"ipv4Public": {}})]
    assert "not used by login" in rules.login_access(_ctx(mocked, resources=extra_ip))[0]


def test_data_protected_and_exemption(mocked):
    _, resources = mocked("demo")
    loose = _replace(resources, "innovationbank-fs-jail-submount-model", protect=False, props={"forbidDeletion": False})
    [message] = rules.data_protected(_ctx(mocked, resources=loose))
    assert "innovationbank-fs-jail-submount-model" in message
    _, dev_resources = mocked("dev")
    assert len(rules.data_protected(_ctx(mocked, "dev", exemptStacks=[]))) == len(
        [r for r in dev_resources if r.type == rules.FILESYSTEM])


def test_jail_backed_up(mocked):
    cfg, _ = mocked("demo")
    off = cfg.model_copy(update={"buckets": cfg.buckets.model_copy(
        update={"backups": cfg.buckets.backups.model_copy(update={"enabled": False})})})
    assert "not backed up" in rules.jail_backed_up(_ctx(mocked, cfg=off))[0]
    assert "not backed up" in rules.jail_backed_up(_ctx(mocked, "dev", exemptStacks=[]))[0]
    _, resources = mocked("demo")
    release = next(r for r in resources if r.name == "innovationbank-soperator-soperator-backup-config")
    values = release.props["values"]
    no_schedule = _replace(resources, release.name, props={"values": {**values, "backup": {"schedule": ""}}})
    assert "values.backup.schedule is ''" in rules.jail_backed_up(_ctx(mocked, resources=no_schedule))[0]
    short = {**values, "prune": {**values["prune"], "retention": {"keepDaily": 2}}}
    assert "keepDaily" in rules.jail_backed_up(_ctx(mocked, resources=_replace(resources, release.name,
                                                                                props={"values": short})))[0]
    bucket_only = [r for r in resources if r.name != release.name]
    assert "nothing writes backups" in rules.jail_backed_up(_ctx(mocked, resources=bucket_only))[0]
    no_secret = [r for r in resources if r.type != rules.K8S_SECRET]
    assert "no Secret jail-backup" in rules.jail_backed_up(_ctx(mocked, resources=no_secret))[0]


def test_artifacts_versioned(mocked):
    _, resources = mocked("demo")
    unversioned = _replace(resources, "innovationbank-buckets-artifacts", props={"versioningPolicy": "DISABLED"})
    assert "'DISABLED'" in rules.artifacts_versioned(_ctx(mocked, resources=unversioned))[0]


def test_preemptible_workers_need_checkpointing_and_requeue(mocked):
    cfg, _ = mocked("demo")
    spot_workers = [w.model_copy(update={"preemptible": True}) for w in cfg.nodes.workers]
    spot = cfg.model_copy(update={"nodes": cfg.nodes.model_copy(update={"workers": spot_workers})})
    run = load_run(cfg, ROOT)
    assert run.train.requeue and run.train.save_steps
    assert rules.preemptible_needs_resume(_ctx(mocked, cfg=spot, run=run)) == []
    no_train = run.model_copy(update={"train": None})
    assert "preemptible" in rules.preemptible_needs_resume(_ctx(mocked, cfg=spot, run=no_train))[0]
    no_requeue = run.model_copy(update={"train": run.train.model_copy(update={"requeue": False})})
    assert "requeue=False" in rules.preemptible_needs_resume(_ctx(mocked, cfg=spot, run=no_requeue))[0]


@pytest.mark.parametrize("value", [
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "ghp_" + "a1B2" * 9,
    "hf_" + "x" * 34,
])
def test_secret_looking_values_are_caught(mocked, value):
    assert rules.secret_looking_values({"pipeline": {"note": value}}, [])
    _, resources = mocked("demo")
    leaked = resources + [Res(type="kubernetes:core/v1:Secret", name="leak", props={"stringData": {"k": value}})]
    assert any("leak" in m for m in rules.no_plain_secrets(_ctx(mocked, resources=leaked)))


def test_secret_key_names_in_config_but_not_public_keys():
    assert rules.secret_looking_values({"nebius": {"apiToken": "abc"}}, []) != []
    assert rules.secret_looking_values({"sshPublicKeys": ["ssh-ed25519 AAAAC3Nza user@host"]}, []) == []
    assert rules.secret_looking_values({"apiToken": "[secret]"}, []) == []


def test_enforcement_level_from_policy_config(mocked):
    cfg, resources = mocked("demo")
    config = {"monthly-budget": {"maxMonthlyUsd": 100, "enforcementLevel": "advisory"}}
    results = evaluate(resources, cfg, None, config)
    budget = next(r for r in results if r.policy == "monthly-budget")
    assert not budget.passed and budget.enforcement == "advisory"
    assert mandatory_failures(results) == []


def _ftstack(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("stack", STACKS)
def test_ftstack_plan_with_policies_passes_for_every_stack(stack):
    proc = _ftstack("--stack", stack, "--policies")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"Policies ({len(rules.POLICIES)}, 0 mandatory violations)" in proc.stdout


def test_ftstack_plan_json_carries_resources_cost_and_policies():
    proc = _ftstack("--stack", "demo", "--policies", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["resources"]) > 20
    assert doc["cost"]["monthly"]["usd_high"] == pytest.approx(19054, rel=0.01)
    assert {p["policy"] for p in doc["policies"]} == {p.name for p in rules.POLICIES}
    # the low end has every ephemeral worker powered down: seed 000's low less its workers and their disks
    assert doc["outputs"]["cost_monthly_usd_low"] == pytest.approx(18124 - 16680 - 148, rel=0.01)


def test_seed_001_over_quota_stack_fails_the_plan(tmp_path):
    document = yaml.safe_load((ROOT / "stacks" / "Pulumi.demo.yaml").read_text())
    filesystems = document["config"]["soperator-finetune:filesystems"]
    for submount in filesystems["submounts"]:
        submount["sizeGib"] = 2048
    (tmp_path / "Pulumi.overquota.yaml").write_text(yaml.safe_dump(document))
    proc = _ftstack("--stack", "overquota", "--config-dir", str(tmp_path), "--policies")
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "[FAIL] filesystem-quota" in proc.stdout and "exceeds the quota of 5,120 GiB" in proc.stdout


def test_policy_pack_builds_and_serves():
    """`policies/__main__.py` builds the PolicyPack: the analyzer prints its gRPC port and keeps serving."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "policies" / "__main__.py")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = proc.stdout.readline().strip()
        assert port.isdigit(), proc.stderr.read() if proc.poll() is not None else port
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- a first `pulumi preview`: ids and computed outputs are unknown ---------------------------------------

@pytest.fixture(scope="module")
def previewed():
    cache: dict[str, tuple] = {}

    def get(stack: str):
        if stack not in cache:
            cfg = load_stack_config(stack, ROOT / "stacks")
            run = run_under_mocks(cfg, {"pipelineSshPrivateKey": "k"}, preview=True)
            cache[stack] = (cfg, [Res.from_mock(r) for r in run.resources])
        return cache[stack]

    return get


@pytest.mark.parametrize("stack", ["dev", "demo", "h100"])
def test_preview_every_policy_runs_and_passes_and_names_what_was_unknown(previewed, stack):
    cfg, resources = previewed(stack)
    node_group = next(r for r in resources if r.type == rules.NODE_GROUP)
    assert node_group.props["parentId"] is rules.UNKNOWN, "a preview leaves the new cluster's id unknown"
    results = evaluate(resources, cfg, load_run(cfg, ROOT))
    assert [r.policy for r in results] == [p.name for p in rules.POLICIES]
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    secrets = next(r for r in results if r.policy == "no-plain-secrets")
    assert any(f"{node_group.name}: " in u and "existingFilesystem.id" in u for u in secrets.unchecked)


def test_preview_crafted_stacks_fail_on_what_is_known_and_report_the_rest(previewed):
    cfg, resources = previewed("demo")
    big = _replace(resources, "innovationbank-fs-jail-submount-data", props={"sizeGibibytes": 8192})
    assert mandatory_failures(evaluate(big, cfg))[0].policy == "filesystem-quota"
    unknown_size = _replace(big, "innovationbank-fs-jail-submount-model", props={"sizeGibibytes": rules.UNKNOWN})
    [quota] = [r for r in evaluate(unknown_size, cfg) if r.policy == "filesystem-quota"]
    assert not quota.passed
    assert quota.unchecked == ["innovationbank-fs-jail-submount-model: sizeGibibytes is unknown until the resource exists"]
    release = next(r for r in resources if r.name == "innovationbank-soperator-soperator-backup-config")
    unknown_values = _replace(resources, release.name, props={"values": rules.UNKNOWN})
    [backup] = [r for r in evaluate(unknown_values, cfg) if r.policy == "jail-backed-up"]
    assert backup.passed and any("values.backup.schedule is unknown" in u for u in backup.unchecked)
    loose = _replace(resources, "innovationbank-fs-jail", protect=False)
    assert "innovationbank-fs-jail" in rules.data_protected(_ctx(mocked=lambda s: (cfg, loose)))[0]


def test_policy_engine_unknowns_become_unknown_not_an_exception():
    from types import SimpleNamespace

    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

    props = unknown_checking_proxy({"name": "worker", "status": UNKNOWN_STRING_VALUE,
                                    "template": {"filesystems": [{"id": UNKNOWN_STRING_VALUE}], "preset": "p"}})
    engine_resource = SimpleNamespace(resource_type=rules.NODE_GROUP, name="worker", urn="u",
                                      opts=SimpleNamespace(protect=False), props=props)
    res = Res.from_policy(engine_resource)
    assert res.props == {"name": "worker", "status": rules.UNKNOWN,
                         "template": {"filesystems": [{"id": rules.UNKNOWN}], "preset": "p"}}


def test_preview_workflow_can_comment_create_the_stack_and_get_a_token():
    flow = yaml.safe_load((ROOT / ".github/workflows/preview.yml").read_text())
    assert flow["permissions"]["pull-requests"] == "write"
    steps = flow["jobs"]["preview"]["steps"]
    preview = next(s for s in steps if str(s.get("uses", "")).startswith("pulumi/actions"))
    assert preview["with"]["upsert"] is True and preview["with"]["policyPacks"] == "policies"
    cli = [s for s in steps if "nebius" in str(s.get("run", ""))]
    assert cli and steps.index(cli[0]) < steps.index(preview)


def test_budget_and_model_fits_show_the_estimated_training_cost_beside_the_monthly_tco():
    """demo (5 x 2 L40S, no run of its own): both rules pass and report the training run priced by estimate."""
    cfg = load_stack_config("demo")
    budget = Context([], cfg, load_run(cfg), {"maxMonthlyUsd": 50_000})
    assert rules.monthly_budget(budget) == []
    (note,) = budget.notes
    assert note.startswith("monthly cost $19,") and "; training run $" in note
    assert "estimated from NVIDIA H100 SXM" in note and "scaled by 0.366" in note
    fits = Context([], cfg, load_run(cfg), {})
    assert rules.model_fits(fits) == []
    assert fits.notes[0].startswith("training run $") and "estimated from NVIDIA H100 SXM" in fits.notes[0]
    over = Context([], cfg, load_run(cfg), {"maxMonthlyUsd": 1_000})
    (violation,) = rules.monthly_budget(over)
    assert "exceeds the budget $1,000" in violation and "(besides: training run $" in violation
