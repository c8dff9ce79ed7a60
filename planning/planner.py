"""The one planner: `plan_run(stack, run, measured)` decides a run on a stack once and returns its `RunPlan`
(documents/run_plan.py). Pure: the stack as the planner reads it (planning.stack), the run config, what runs
measured (training throughput, the prepare summary, the ranks of stored adapters a server loads, the newest stored
run's job times) in; the plan out.

Per stage the Slurm request (readiness one task per GPU on every node; train one task per node on the nodes it trains
fastest on at the throughput it is priced with, `planning.fit`; eval one GPU; serve and publish a node; prepare a
node's CPUs; the environment build in the housekeeping partition on a nebius stack), the time limits
(planning.time_limits, training's from the estimated hours), the training placement with its memory per rank, what
serving needs (planning.serving), and the hours, node-hours and price of each run stage (training at its estimate,
the others at the newest stored run's job times; `stage_costs`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from documents.prepare_summary import PrepareSummary
from documents.run_config import RunConfig
from documents.run_plan import RunPlan, SlurmRequest, StageCost, TrainingPlacement, TrainingSize
from documents.throughput import ThroughputMeasurement
from planning import catalog
from planning.fit import worker_fits
from planning.model_shapes import ModelShape, UnknownModel, shape_for_source
from planning.placement import Hardware, Placement, decide_placement
from planning.prices import PriceBook, node_price
from planning.run_size import passes, training_tokens
from planning.serving import serving_plan
from planning.stack import PlanStack
from planning.throughput import TrainingThroughput, training_throughput
from planning.time_limits import TimeLimitError, stage_time_limits, train_time_limit
from planning.workers import worker_shape

STAGES = ("environment", "prepare", "readiness", "train", "eval", "serve", "publish")
RUN_STAGES = ("prepare", "readiness", "train", "eval")
"""the stages a run holds nodes for until it ends (serving is priced by the schedule, the environment build runs
once per lock in the housekeeping partition)."""
SECONDS_PER_HOUR = 3600


class PlanRefused(ValueError):
    """A plan that must not be submitted (the message names the figure and the limit)."""


def _hardware(stack: PlanStack) -> Hardware | None:
    """What the run is placed on: the first worker set's GPUs (catalog.USABLE_GPU_MEMORY) and RAM, or an existing
    cluster's GPUs where their memory is known; None on workers without GPUs."""
    if stack.workers:
        first = stack.workers[0]
        platform = catalog.get_platform(first.platform)
        if not platform.is_gpu:
            return None
        return Hardware(gpu_memory_gib=platform.usable_gpu_memory_gib, gpus_per_node=first.shape.gpus,
                        host_memory_gib=first.shape.ram_gib)
    cluster = stack.cluster
    if cluster is None or not cluster.gpus_per_node or cluster.gpu_memory_gib is None:
        return None
    return Hardware(gpu_memory_gib=cluster.gpu_memory_gib, gpus_per_node=cluster.gpus_per_node,
                    host_memory_gib=cluster.memory_gib_per_node)


def training_placement(stack: PlanStack, run: RunConfig, tokens_per_second_per_gpu: float | None,
                       shape: ModelShape | None = None) -> Placement | None:
    """Where the run trains: on the stack's first GPU worker set the nodes `worker_fits` chooses at the throughput
    the run is priced with, on an existing cluster with known GPUs all of its training nodes; None without a train
    section, on workers without GPUs or where the model's shape is unknown here (`shape`: the model folder's, else
    the catalog's for the source)."""
    hardware = _hardware(stack)
    if run.train is None or hardware is None:
        return None
    try:
        shape = shape or shape_for_source(run.model.source)
    except UnknownModel:
        return None
    if not stack.workers:
        return decide_placement(run, shape, hardware, worker_shape(stack)[0])
    fits = worker_fits(stack, run, shape, tokens_per_second_per_gpu)
    if not fits or fits[0].worker_set != stack.workers[0].name:
        return None
    return fits[0].placement


def _adaptable(run: RunConfig) -> list:
    train = run.train
    if train is None:
        return []
    found = ["micro_batch_tokens"] if train.micro_batch_tokens == "auto" else []
    return found + (["gradient_checkpointing"] if train.gradient_checkpointing == "auto" else [])


def placement_document(stack: PlanStack, run: RunConfig, placed: Placement) -> TrainingPlacement:
    hardware = _hardware(stack)
    return TrainingPlacement(
        nodes=placed.nodes, gpus_per_node=placed.gpus_per_node,
        gpu_memory_gib=hardware.gpu_memory_gib if hardware is not None else None,
        host_memory_gib=placed.host_memory_gib, parallelism=placed.plan, batches=placed.batches,
        host_bytes_per_node=placed.host_bytes_per_node, fits=placed.fits, why_not=placed.why_not,
        adaptable=_adaptable(run))


def worker_cpus(stack: PlanStack) -> int:
    """CPUs Slurm counts on one training worker: the cluster's cpusPerNode, or the CPU topology of the first worker
    set's preset (the CPUs= its NodeSet's nodeConfig.static gives Slurm, infra/soperator/values.py)."""
    if stack.cluster is not None:
        return stack.cluster.cpus_per_node
    first = stack.workers[0]
    return catalog.cpu_topology(first.platform, first.preset).cpus


def _placement(stage: str, stack: PlanStack, train_nodes: int) -> dict[str, int]:
    """Readiness one task per GPU on every node, train one task per node on `train_nodes`, eval one GPU, serve and
    publish a node; without GPUs (an existing CPU cluster) readiness and train one task on each of the nodes."""
    nodes, gpus = worker_shape(stack)
    if stack.target == "local" or stage in ("prepare", "environment"):
        return {"nodes": 1} if stage == "environment" else {}
    if gpus == 0:
        if stack.cluster is None:
            return {}
        if stage in ("readiness", "train"):
            return {"nodes": nodes if stage == "readiness" else train_nodes, "ntasks_per_node": 1}
        return {"nodes": 1}
    if stage == "readiness":
        return {"nodes": nodes, "gpus_per_node": gpus, "ntasks_per_node": gpus}
    if stage == "train":
        return {"nodes": train_nodes, "gpus_per_node": gpus, "ntasks_per_node": 1}
    return {"nodes": 1, "gpus_per_node": 1 if stage == "eval" else gpus}


def _cpus(stage: str, stack: PlanStack) -> dict[str, int | str]:
    """The CPUs a job asks for (Soperator 4.1.7 allocates cores and renders no DefCpuPerGPU: a job that asks nothing
    gets one CPU, configmap.go:351, 537): readiness's tasks share their node's CPUs, eval takes its GPU's share, the
    rest every CPU of their node; the environment build on a nebius stack the housekeeping slurmd's."""
    if stack.target == "local":
        return {}
    if stage == "environment" and stack.housekeeping_partition is not None:
        return {"partition": stack.housekeeping_partition, "cpus_per_task": stack.housekeeping_cpus or 1}
    cpus = worker_cpus(stack)
    _, gpus = worker_shape(stack)
    if gpus and stage == "readiness":
        return {"cpus_per_task": max(1, cpus // gpus)}
    if gpus and stage == "eval":
        return {"cpus_per_gpu": max(1, cpus // gpus)}
    return {"cpus_per_task": cpus}


def stage_requests(stack: PlanStack, run: RunConfig, train_nodes: int,
                   limits: dict[str, int | None]) -> dict[str, SlurmRequest]:
    """Each stage's Slurm request; with workers reserved for serving, serve in their partition and every other
    stage (the environment build aside) in the training one."""
    requests = {}
    for stage in STAGES:
        fields: dict = {"time_limit_minutes": limits[stage], **_placement(stage, stack, train_nodes),
                        **_cpus(stage, stack)}
        if stack.serving_on and stage != "environment":
            fields["partition"] = stack.serving_partition if stage == "serve" else stack.training_partition
        if stage == "train" and run.train is not None and not run.train.requeue:
            fields["requeue"] = False
        requests[stage] = SlurmRequest(**fields)
    return requests


def nodes_hourly_usd(stack: PlanStack, nodes: int) -> float | None:
    """An hour of `nodes` nodes of the first worker set (compute), on a nebius stack; None elsewhere."""
    if stack.target != "nebius" or not stack.workers:
        return None
    first = stack.workers[0]
    book = PriceBook(stack.pricing.overrides)
    return nodes * node_price(first.platform, first.preset, book, preemptible=first.preemptible).usd_per_hour


def _throughput_notes(stack: PlanStack, throughput: TrainingThroughput | None, notes: list[str]) -> None:
    if throughput is None:
        notes.append("training run: no throughput (set pricing.training.tokensPerSecondPerGpu or run training once)")
    elif throughput.kind in ("borrowed", "estimated"):
        notes.append(f"training run: stack {stack.stack!r} has no throughput measured by a run of its own; priced "
                     f"with the {throughput.kind} figure above")


def train_cost(stack: PlanStack, run: RunConfig, nodes: int, throughput: TrainingThroughput | None,
               measured: ThroughputMeasurement | None, prepared: PrepareSummary | None,
               notes: list[str]) -> tuple[TrainingSize | None, StageCost | None]:
    """The training run's tokens, passes and throughput, and its hours, node-hours and price on the `nodes` it trains
    on at `throughput` (on an existing CPU cluster, the GPUs `measured` counted)."""
    if stack.target == "local" or run.train is None:
        return None, None
    size = training_tokens(stack, run, prepared, notes)
    if size is None:
        return None, None
    _, gpus_per_node = worker_shape(stack)
    if gpus_per_node:
        gpus = nodes * gpus_per_node
    else:
        gpus = measured.devices if measured is not None else 0
    tokens, rows = size
    epochs = passes(run.train, tokens, rows, gpus, run.max_length, notes)
    _throughput_notes(stack, throughput, notes)
    hourly = nodes_hourly_usd(stack, nodes)
    if hourly is None:
        notes.append("training run: an existing cluster has no price here; hours only")
    tps = throughput.tokens_per_second_per_gpu if throughput else None
    hours = tokens * epochs / (tps * gpus) / SECONDS_PER_HOUR if tps and gpus else None
    sized = TrainingSize(tokens=tokens, epochs=epochs, tokens_per_second_per_gpu=tps,
                         throughput_kind=throughput.kind if throughput else "unknown",
                         throughput_source=throughput.source() if throughput else "unknown",
                         throughput_figure=throughput.basis.describe() if throughput and throughput.basis else None,
                         throughput_ratio=throughput.ratio if throughput and throughput.kind == "estimated" else None)
    basis = (f"{tokens:,.0f} tokens x {epochs:.3g} passes at {tps:,.0f} tokens/s per GPU ({sized.throughput_kind}) "
             f"over {gpus} GPU(s) on {nodes} node(s)" if hours is not None else "throughput or GPUs unknown")
    cost = StageCost(stage="train", hours=hours, nodes=nodes, gpus=gpus,
                     node_hours=hours * nodes if hours is not None else None, usd_per_hour=hourly,
                     usd=hours * hourly if hours is not None and hourly is not None else None, basis=basis)
    return sized, cost


def stage_costs(stack: PlanStack, requests: dict[str, SlurmRequest], train: StageCost | None,
                stage_seconds: Mapping[str, float], measured_from: str | None) -> list[StageCost]:
    """Each run stage's hours, the nodes and GPUs its request holds, and their price: training at its estimate
    (`train`; no hours without one), every other stage at the elapsed time the newest stored run measured (none
    before a run timed it); each with that run's measured hours beside (`StageCost.measured_hours`)."""
    costs = []
    for stage in RUN_STAGES:
        measured = stage_seconds[stage] / SECONDS_PER_HOUR if stage in stage_seconds else None
        if stage == "train" and train is not None:
            costs.append(train.model_copy(update={"measured_hours": measured}))
            continue
        if stage == "train":
            hours, basis = None, "not estimated (no throughput, data size or train section)"
        elif measured is not None:
            hours, basis = measured, f"measured job time of {measured_from or 'the newest stored run'}"
        else:
            hours, basis = None, "not measured: no stored run of the stack timed it"
        request = requests[stage]
        nodes = request.nodes or 1
        hourly = nodes_hourly_usd(stack, nodes)
        costs.append(StageCost(
            stage=stage, hours=hours, nodes=nodes, gpus=nodes * (request.gpus_per_node or 0),
            node_hours=hours * nodes if hours is not None else None, usd_per_hour=hourly,
            usd=hours * hourly if hours is not None and hourly is not None else None, basis=basis,
            measured_hours=measured))
    return costs


def plan_run(stack: PlanStack, run: RunConfig, measured: ThroughputMeasurement | None = None, *,
             prepared: PrepareSummary | None = None, read_from: str | None = None,
             stored_ranks: Sequence[int] = (), shape: ModelShape | None = None,
             stage_seconds: Mapping[str, float] | None = None, stage_seconds_from: str | None = None) -> RunPlan:
    """The run's plan on the stack (module docstring); `measured`: the training throughput a run on the stack
    measured (read from `read_from`); `stored_ranks`: the adapter ranks of the stored runs the server loads (the
    serving store), which the engine's rank limit must take as well; `shape`: the model's, where the caller read it
    from the model folder; `stage_seconds`: each stage's elapsed seconds in the newest stored run that timed them
    (`stage_seconds_from` names it)."""
    notes: list[str] = []
    throughput = training_throughput(stack, run, measured, read_from) if run.train is not None else None
    placed = training_placement(stack, run, throughput.tokens_per_second_per_gpu if throughput else None, shape)
    train_nodes = placed.nodes if placed is not None else worker_shape(stack)[0]
    size, cost = train_cost(stack, run, train_nodes, throughput, measured, prepared, notes)
    hours = cost.hours if cost is not None else None
    try:
        train_time_limit(run.time_limits, hours)
    except TimeLimitError as error:
        notes.append(f"refused: {error}")
        hours = None
    requests = stage_requests(stack, run, train_nodes, stage_time_limits(run.time_limits, hours))
    return RunPlan(
        stack=stack.stack, target=stack.target, run=run.name, stages=requests,
        training=placement_document(stack, run, placed) if placed is not None else None,
        size=size, tokens_per_second_per_gpu=throughput.tokens_per_second_per_gpu if throughput else None,
        serving=serving_plan(run, stored_ranks),
        costs=stage_costs(stack, requests, cost, stage_seconds or {}, stage_seconds_from),
        stage_times_from=stage_seconds_from if stage_seconds else None, notes=notes)


def refusals(plan: RunPlan) -> list[str]:
    """Why the plan must not be submitted: a training time limit past a year, an adapter rank the serving engine's
    configured limit cannot take."""
    found = [note.removeprefix("refused: ") for note in plan.notes if note.startswith("refused: ")]
    if plan.serving is not None and not plan.serving.fits:
        found.append(plan.serving.basis)
    return found


def check_plan(plan: RunPlan) -> None:
    """Raise PlanRefused naming every reason the plan must not be submitted."""
    if found := refusals(plan):
        raise PlanRefused(f"run {plan.run!r} on stack {plan.stack!r}: " + "; ".join(found))
