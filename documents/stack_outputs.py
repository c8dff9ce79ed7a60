"""Stack outputs: one typed document, flattened into Pulumi's output keys only where they are exported.

The Pulumi program and `ftstack run` build a `StackOutputs`; `StackOutputs.flat` is the one place the flat keys
are written (the program exports them with `pulumi.export`, `ftstack run` writes them as JSON). Every reader
(`ftstack report`, the dashboard, tests) reads them back with `read_stack_outputs`, which takes what a user with
the Pulumi CLI has: the object `pulumi stack output --json` prints (secrets shown as `[secret]`), or a document
with such an object under `outputs` (`ftstack plan --json`). Entities (cost lines, categories, chat scenarios,
node groups, filesystems, buckets, pipeline stages) are listed by name in their own keys (`cost_lines`, ...), so
no reader parses a key. The README's stack outputs contract lists every key.

At program time a leaf may still be a `pulumi.Output` (ids, job states): the program builds those sections with
`model_construct` and `flat` copies leaves as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, ValidationError

from documents.base import DocumentError, Figures, describe
from documents.text_input import TextInputError, load_json

SECRET = "[secret]"
"""how `pulumi stack output --json` shows a secret without --show-secrets."""
SIDES = ("base", "finetuned")
MEASURED = "measured"
"""the cost-per-chat scenario at the fine-tuned model's generation speed measured by the eval job."""


def flat_name(name: str) -> str:
    """A config name as it appears inside a key (node group, filesystem tag)."""
    return name.replace("-", "_")


class _Section(Figures):
    model_config = ConfigDict(extra="forbid")


class Category(_Section):
    usd_low: float
    usd_high: float


class CostLine(_Section):
    """One priced resource, with the texts the dashboard shows."""

    usd_low: float
    usd_high: float
    category: str
    label: str
    quantity: str
    unit_price: str


class ChatCost(_Section):
    """One cost-per-chat scenario; the `measured` one is null until the eval job reported."""

    tokens_per_second: float | None = None
    conversations_per_day: float | None = None
    usd: float | None = None


class TrainingCost(_Section):
    """One training run's estimate; figures are null where the throughput is unknown."""

    tokens: float
    gpus: int
    tokens_per_second_per_gpu: float | None = None
    gpu_hours: float | None = None
    wall_hours: float | None = None
    usd: float | None = None
    throughput_source: str | None = None
    throughput_kind: str | None = None
    """configured, measured (this stack), borrowed (the same GPU model elsewhere), estimated or unknown."""


class UtilizationCost(_Section):
    """The month at the stack's schedule (pricing.schedule) with elastic workers priced for the node-hours the runs
    measured, beside the always-on month (`monthly_usd_high`); `basis` says what was measured and assumed."""

    always_on_usd: float
    usd: float
    runs_per_month: float
    run_node_hours: float
    serving_node_hours: float
    serving_usd: float | None = None
    """the serving nodes' month apart from training: reserved serving workers' own lines (always on), else the
    schedule's serving node-hours at the first worker set's hourly price (None: outputs written before it)."""
    worker_node_hours: float
    requeue_overhead: float
    basis: str


class Cost(_Section):
    """The month's cost as three labelled figures: the elastic range (`monthly_usd_low`: workers idle at their
    minimum, `monthly_usd_high`: all up), the always-on range (every worker up all month: seed 000's table) and,
    under `utilization`, the month at the node-hours the runs measured."""

    monthly_usd_low: float
    monthly_usd_high: float
    hours_per_month: int
    pricing_date: str
    always_on_usd_low: float | None = None
    always_on_usd_high: float | None = None
    """None: outputs written before the always-on range was exported."""
    categories: dict[str, Category] = {}
    lines: dict[str, CostLine] = {}
    chats: dict[str, ChatCost] = {}
    training: TrainingCost | None = None
    utilization: UtilizationCost | None = None

    def flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cost_monthly_usd_low": self.monthly_usd_low, "cost_monthly_usd_high": self.monthly_usd_high,
            "cost_hours_per_month": self.hours_per_month, "cost_pricing_date": self.pricing_date,
            "cost_categories": list(self.categories),
        }
        if self.always_on_usd_low is not None and self.always_on_usd_high is not None:
            out |= {"cost_always_on_usd_low": self.always_on_usd_low,
                    "cost_always_on_usd_high": self.always_on_usd_high}
        for name, category in self.categories.items():
            out |= {f"cost_category_{name}_usd_{bound}": value for bound, value in
                    (("low", category.usd_low), ("high", category.usd_high))}
        out["cost_lines"] = list(self.lines)
        for name, line in self.lines.items():
            out |= {f"cost_line_{name}_{field}": getattr(line, field) for field in CostLine.model_fields}
        out["cost_per_chat_scenarios"] = list(self.chats)
        for name, chat in self.chats.items():
            out |= {f"cost_per_chat_{name}_{field}": getattr(chat, field) for field in ChatCost.model_fields}
        if self.training is not None:
            out |= {f"training_run_{field}": value for field in TrainingCost.model_fields
                    if (value := getattr(self.training, field)) is not None}
        if self.utilization is not None:
            out |= {f"cost_utilization_{field}": getattr(self.utilization, field)
                    for field in UtilizationCost.model_fields}
        return out

    @classmethod
    def unflatten(cls, flat: Mapping[str, Any]) -> dict[str, Any]:
        training = {field: flat[f"training_run_{field}"] for field in TrainingCost.model_fields
                    if f"training_run_{field}" in flat}
        return {
            "monthly_usd_low": flat["cost_monthly_usd_low"], "monthly_usd_high": flat["cost_monthly_usd_high"],
            "hours_per_month": flat["cost_hours_per_month"], "pricing_date": flat["cost_pricing_date"],
            "always_on_usd_low": flat.get("cost_always_on_usd_low"),
            "always_on_usd_high": flat.get("cost_always_on_usd_high"),
            "categories": {name: {"usd_low": flat[f"cost_category_{name}_usd_low"],
                                  "usd_high": flat[f"cost_category_{name}_usd_high"]}
                           for name in flat["cost_categories"]},
            "lines": {name: {field: flat[f"cost_line_{name}_{field}"] for field in CostLine.model_fields}
                      for name in flat["cost_lines"]},
            "chats": {name: {field: flat[f"cost_per_chat_{name}_{field}"] for field in ChatCost.model_fields}
                      for name in flat["cost_per_chat_scenarios"]},
            "training": training or None,
            "utilization": {field: flat[key] for field in UtilizationCost.model_fields
                            if (key := f"cost_utilization_{field}") in flat}
            if "cost_utilization_usd" in flat else None,
        }


class NodeGroup(_Section):
    id: str | None = None
    platform: str
    preset: str
    nodes: int
    max_nodes: int
    gpus_per_node: int
    boot_disk_gib: int


class Filesystem(_Section):
    id: str | None = None
    size_gib: int | None = None


PLATFORM_FACTS = ("region", "k8s_version", "cluster_id", "cluster_endpoint", "subnet_id", "login_address",
                  "login_port", "login_allocation_id", "soperator_version", "slurm_version", "slurm_namespace",
                  "kubeconfig", "worker_nodes", "gpus_total")


class Platform(_Section):
    """The cloud platform of a nebius stack: cluster, login, Soperator, node groups, filesystems, buckets."""

    region: str
    k8s_version: str
    cluster_id: str | None = None
    cluster_endpoint: str | None = None
    subnet_id: str | None = None
    login_address: str | None = None
    login_port: int
    login_allocation_id: str | None = None
    soperator_version: str
    slurm_version: str
    slurm_namespace: str
    kubeconfig: str | None = None
    """secret: `[secret]` as the CLI prints it."""
    worker_nodes: int
    gpus_total: int
    node_groups: dict[str, NodeGroup] = {}
    filesystems: dict[str, Filesystem] = {}
    buckets: dict[str, str | None] = {}
    """bucket kind (artifacts, backups, ...) -> bucket name."""

    def flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {fact: getattr(self, fact) for fact in PLATFORM_FACTS}
        out["node_groups"] = list(self.node_groups)
        for name, group in self.node_groups.items():
            out |= {f"node_group_{name}_{field}": getattr(group, field) for field in NodeGroup.model_fields}
        out["filesystems"] = list(self.filesystems)
        for tag, filesystem in self.filesystems.items():
            out |= {f"filesystem_{tag}_{field}": getattr(filesystem, field) for field in Filesystem.model_fields}
        out["buckets"] = list(self.buckets)
        out |= {f"{kind}_bucket_name": name for kind, name in self.buckets.items()}
        return out

    @classmethod
    def unflatten(cls, flat: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **{fact: flat[fact] for fact in PLATFORM_FACTS},
            "node_groups": {name: {field: flat[f"node_group_{name}_{field}"] for field in NodeGroup.model_fields}
                            for name in flat["node_groups"]},
            "filesystems": {tag: {field: flat[f"filesystem_{tag}_{field}"] for field in Filesystem.model_fields}
                            for tag in flat["filesystems"]},
            "buckets": {kind: flat[f"{kind}_bucket_name"] for kind in flat["buckets"]},
        }


class Job(_Section):
    job_id: str | None = None
    state: str | None = None
    elapsed_s: int | None = None


class EvalSide(_Section):
    """The evaluator's headline figures of one side."""

    perplexity: float | None = None
    tokens_per_second: float | None = None
    time_to_first_token_s: float | None = None
    rouge_l: float | None = None
    exact_match: float | None = None
    numeric_match: float | None = None


class Pipeline(_Section):
    """The jobs of the stack's pipeline and, with an eval stage, the evaluation (null figures until it reported)."""

    bundle_hash: str | None = None
    jobs: dict[str, Job] = {}
    evaluation: dict[str, EvalSide] | None = None
    """side (base, finetuned) -> figures, when the pipeline has an eval stage."""

    def flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pipeline_bundle_hash": self.bundle_hash, "pipeline_stages": list(self.jobs)}
        for stage, job in self.jobs.items():
            out |= {f"pipeline_{stage}_{field}": getattr(job, field) for field in Job.model_fields}
        for side, figures in (self.evaluation or {}).items():
            out |= {f"eval_{figure}_{side}": getattr(figures, figure) for figure in EvalSide.model_fields}
        return out

    @classmethod
    def unflatten(cls, flat: Mapping[str, Any]) -> dict[str, Any]:
        stages = flat["pipeline_stages"]
        return {
            "bundle_hash": flat["pipeline_bundle_hash"],
            "jobs": {stage: {field: flat[f"pipeline_{stage}_{field}"] for field in Job.model_fields}
                     for stage in stages},
            "evaluation": {side: {figure: flat[f"eval_{figure}_{side}"] for figure in EvalSide.model_fields}
                           for side in SIDES} if "eval" in stages else None,
        }


class Environment(_Section):
    """The workloads' environment on the cluster: the lock it is built from and how; its installed size and build
    time once the environment stage has built it (null before, and on the Pulumi path until `ftstack run`)."""

    key: str
    lock_hash: str
    source: str
    image: str | None = None
    wheels_bytes: int | None = None
    """download size of the locked wheels for the cluster's Python and platform."""
    size_bytes: int | None = None
    build_seconds: float | None = None
    serving_key: str | None = None
    """the serving environment (vLLM's own, stacks with GPU workers): its folder's name under the same root."""
    serving_lock_hash: str | None = None
    serving_vllm_version: str | None = None
    serving_python: str | None = None
    """its interpreter, the serve job's FT_VLLM_PYTHON."""

    def flat(self) -> dict[str, Any]:
        return {f"environment_{field}": getattr(self, field) for field in Environment.model_fields}

    @classmethod
    def unflatten(cls, flat: Mapping[str, Any]) -> dict[str, Any]:
        return {field: flat[f"environment_{field}"] for field in cls.model_fields if f"environment_{field}" in flat}


class MonitoringAccess(_Section):
    """How to open Grafana and query the metrics store from a workstation holding the stack's kubeconfig
    (`kubectl port-forward`, never a public endpoint); keys `monitoring_<field>`."""

    grafana_port_forward: str
    grafana_url: str
    grafana_admin_user: str
    grafana_admin_password_command: str
    """prints the admin password from its Secret; the password itself is never an output."""
    metrics_port_forward: str
    metrics_query_url: str

    def flat(self) -> dict[str, Any]:
        return {f"monitoring_{field}": getattr(self, field) for field in MonitoringAccess.model_fields}

    @classmethod
    def unflatten(cls, flat: Mapping[str, Any]) -> dict[str, Any]:
        return {field: flat[f"monitoring_{field}"] for field in MonitoringAccess.model_fields}


class ServedAdapter(_Section):
    """One adapter a server serves: its run, its measured generation speed and the cost per chat at that speed
    (the `measured` scenario's arithmetic with the adapter's own tokens/s)."""

    run_id: str
    tokens_per_second: float | None = None
    time_to_first_token_s: float | None = None
    usd_per_chat: float | None = None


class Serving(_Section):
    """The adapters of the stack's server (its `served_adapters.json`); keys `served_adapter_<name>_<field>`."""

    adapters: dict[str, ServedAdapter] = {}

    def flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {"served_adapters": list(self.adapters)}
        for name, adapter in self.adapters.items():
            out |= {f"served_adapter_{flat_name(name)}_{field}": getattr(adapter, field)
                    for field in ServedAdapter.model_fields}
        return out

    @classmethod
    def unflatten(cls, flat: Mapping[str, Any]) -> dict[str, Any]:
        return {"adapters": {name: {field: flat[f"served_adapter_{flat_name(name)}_{field}"]
                                    for field in ServedAdapter.model_fields} for name in flat["served_adapters"]}}


IDENTITY = ("stack", "target", "cluster_name", "slurm_target", "run_config")


class StackOutputs(_Section):
    """Everything a stack reports: what it is, what it costs, the platform (nebius stacks) and the pipeline."""

    stack: str
    target: str
    cluster_name: str
    slurm_target: str
    run_config: str
    cost: Cost
    platform: Platform | None = None
    monitoring: MonitoringAccess | None = None
    pipeline: Pipeline | None = None
    environment: Environment | None = None
    serving: Serving | None = None

    def flat(self) -> dict[str, Any]:
        """The Pulumi output keys: numbers as numbers, entity names listed, nothing nested."""
        out: dict[str, Any] = {field: getattr(self, field) for field in IDENTITY}
        out |= self.cost.flat()
        if self.platform is not None:
            out |= self.platform.flat()
        if self.monitoring is not None:
            out |= self.monitoring.flat()
        if self.pipeline is not None:
            out |= self.pipeline.flat()
        if self.environment is not None:
            out |= self.environment.flat()
        if self.serving is not None:
            out |= self.serving.flat()
        return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested document of the flat keys (KeyError naming the first key missing)."""
    return {
        **{field: flat[field] for field in IDENTITY},
        "cost": Cost.unflatten(flat),
        "platform": Platform.unflatten(flat) if "node_groups" in flat else None,
        "monitoring": MonitoringAccess.unflatten(flat) if "monitoring_grafana_url" in flat else None,
        "pipeline": Pipeline.unflatten(flat) if "pipeline_stages" in flat else None,
        "environment": Environment.unflatten(flat) if "environment_key" in flat else None,
        "serving": Serving.unflatten(flat) if "served_adapters" in flat else None,
    }


def parse_stack_outputs(document: Any, origin: str) -> StackOutputs:
    """Stack outputs from the flat object Pulumi prints (or a document with it under `outputs`)."""
    if isinstance(document, Mapping) and isinstance(document.get("outputs"), Mapping):
        document = document["outputs"]
    if not isinstance(document, Mapping):
        raise DocumentError(f"{origin}: expected a JSON object of stack outputs, got {type(document).__name__}")
    try:
        return StackOutputs.model_validate(unflatten(document))
    except KeyError as error:
        raise DocumentError(f"{origin}: stack outputs lack the key {error.args[0]!r} (outputs of an older program "
                            "version: run `pulumi up` or `ftstack run` again)") from None
    except TypeError as error:
        raise DocumentError(f"{origin}: stack outputs are malformed ({error})") from None
    except ValidationError as error:
        raise DocumentError(f"{origin}: not valid stack outputs ({describe(error)})") from None


def read_stack_outputs(text: str | bytes, origin: str) -> StackOutputs:
    try:
        document = load_json(text, origin)
    except TextInputError as error:
        raise DocumentError(str(error)) from None
    return parse_stack_outputs(document, origin)


def write_stack_outputs(outputs: StackOutputs) -> str:
    """The JSON `pulumi stack output --json` prints for these outputs."""
    return json.dumps(outputs.flat(), indent=2) + "\n"
