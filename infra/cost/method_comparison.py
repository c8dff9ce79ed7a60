"""The method comparison (``ftstack plan --compare``): for the stack's GPU model and the configured data, each
method (full, LoRA, QLoRA) x each known model size: the parallelism, the GPUs needed, tokens/s per GPU and where
that figure came from, GPU-hours, wall time and cost on demand and preemptible.

- GPUs needed: the fewest GPUs of the stack's model (at the memory PyTorch reports, ``catalog.USABLE_GPU_MEMORY``)
  on which ``decide_placement`` finds a placement that fits; DDP needs one, FSDP as many as the shards need.
- Host GiB: host memory of the busiest of the stack's nodes while the base loads (``host_bytes_per_node``: one
  base on the first node under FSDP, a tensor in flight per rank otherwise); a row over the node's RAM does not
  fit the stack.
- Offload rows: after an FSDP row, the same with FSDP's CPU offload on the fewest whole nodes of the stack's preset
  where it fits, when that is fewer GPUs (on the nodes the trainer takes when it offloads on more, with their
  network time); priced at the row's throughput divided by ``offload_slowdown`` (``OFFLOAD_MODEL``: host copies and
  the CPU optimizer step).
- Where a row trains: on the stack, the fastest of its node counts from the fewest that hold the row's layout
  (``fastest_nodes``, ``NODES_MODEL``); off the stack, the whole nodes it needs. The row of the layout the trainer
  takes on the stack (``fastest_nodes`` over every node count, offload included; what ``model_fit.train_nodes``
  gives the train job's sbatch) is marked ``chosen``.
- Bound and network: each row's bytes per micro-batch and rank by strategy (``network_seconds``) where it trains
  (``decide_placement`` on those nodes, as the trainer decides there), over the peer link within a node and the
  stack's fabric across nodes (``catalog.FABRICS``), overlapped with compute; a row whose network time exceeds its
  compute time is network-bound and priced with the ratio (``NETWORK_MODEL``); otherwise compute- or memory-bound
  by its micro-batch's GEMM intensity against the GPU's ridge. A fabric without a figure is said so, not priced.
- HSDP rows (``hsdp (opt-in)``: the trainer runs them when the run config sets ``train.parallelism: hsdp``; ``auto``
  keeps FSDP over every rank): after a row that would train FSDP over the stack's several nodes while one node's GPUs
  hold its shards, the same GPUs sharding within each node and replicating across nodes (``hsdp_bytes``), priced with
  their own network time.
- Tokens/s per GPU, GPU-hours and cost: each row is priced by ``price_stack`` (the one price path) with the run
  config changed to that model and method, so its tokens/s come from where the stack's own training-run cost
  takes them (configured, measured, borrowed, estimated); the stack's configured figure and the run it measured
  count only for their own model and method. Preemptible: the same with the workers preemptible, where the
  catalog has a preemptible price.
- Wall hours = GPU-hours over the GPUs the row trains on (above); an offload row on the fewest nodes where it fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from documents.atomic import atomic_file
from documents.run_config import RunConfig, parse_run_config
from infra.config import StackConfig
from infra.cost.price import CostReport, PriceInputs, price_stack
from infra.plans import plan_stack
from planning import catalog
from planning.layouts import OnStack, layouts, on_stack
from planning.memory import GIB
from planning.model_shapes import KNOWN, ModelShape, UnknownModel, shape_for_source
from planning.placement import Placement
from planning.time_model import NETWORK_MODEL, OFFLOAD_MODEL, compute_bound, network_seconds, offload_slowdown

METHODS = ("full", "lora", "qlora")
REFERENCE_TOKENS = 100_000_000
"""The tokens a comparison is made for when the configured data has no size here (no data.rows, no prepare summary,
no tokenized split)."""
REFERENCE_ROWS = 10_000
MIN_PARAMS = 1e9
"""Known shapes below this (the local CPU model) are left out of a GPU stack's comparison."""
ThroughputKind = Literal["measured", "borrowed", "estimated", "configured", "unknown"]


class RowThroughput(BaseModel):
    """Tokens/s per GPU for one model and method, and its basis."""

    model_config = ConfigDict(frozen=True)

    tokens_per_second_per_gpu: float | None
    kind: ThroughputKind
    basis: str
    """the training-run cost's source line for this model and method."""
    figure: str | None = None
    """the measured figure it is or was scaled from."""
    ratio: float | None = None
    """estimated: the scale applied to that figure."""

    @property
    def estimated(self) -> bool:
        return self.kind == "estimated"


class CompareRow(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    params_b: float
    method: str
    strategy: str | None
    gpus_needed: int | None
    per_gpu_gib: float | None
    host_gib_per_node: float | None = None
    """host memory of the busiest of the stack's nodes while the base loads (``placement.host_bytes_per_node``)."""
    fits_stack: bool
    throughput: RowThroughput
    gpu_hours: float | None
    wall_hours: float | None
    wall_gpus: int | None
    usd_on_demand: float | None
    usd_preemptible: float | None
    bound: str | None = None
    """what limits the row: compute or memory (its micro-batch's GEMM intensity against the GPU's ridge), or network
    when moving its bytes per micro-batch takes longer than computing it (``network_seconds``)."""
    network_bytes: float | None = None
    """bytes one rank sends or receives per micro-batch (``network_bytes``)."""
    network_slowdown: float | None = None
    """the throughput divisor max(1, network time / compute time) the row is priced with (None: fabric unknown)."""
    offload: Literal["none", "params"] = "none"
    opt_in: str | None = None
    """the run-config setting that trains this row's layout where ``decide_placement`` under ``auto`` takes another
    (HSDP rows: ``train.parallelism: hsdp``); None: the layout the run's own setting gets."""
    slowdown: float | None = None
    """offload rows: the throughput divisor of ``offload_slowdown`` against the same row without offload."""
    micro_batch_tokens: int | None = None
    """the planned micro-batch the network and offload times are computed at."""
    chosen: bool = False
    """the layout the trainer, the train job's node count and the plan take on the stack (``fastest_nodes``)."""


class MethodComparison(BaseModel):
    model_config = ConfigDict(frozen=True)

    stack: str
    gpu_model: str
    gpu_memory_gib: float
    gpus_per_node: int
    node_ram_gib: float
    stack_gpus: int
    tokens: float
    passes: float
    data_basis: str
    usd_per_gpu_hour: float | None
    preemptible_usd_per_gpu_hour: float | None
    rows: list[CompareRow]
    notes: list[str]


def compared_models(run: RunConfig) -> list[str]:
    """Model sources to compare: one hub id per distinct known shape of at least MIN_PARAMS parameters, by size,
    plus the run's own model when its shape is readable and not among them."""
    first: dict[ModelShape, str] = {}
    for name, shape in KNOWN.items():
        if shape.params >= MIN_PARAMS:
            first.setdefault(shape, f"hub:{name}")
    own = run.model.source
    try:
        if shape_for_source(own) not in first:
            first[shape_for_source(own)] = own
    except UnknownModel:
        pass
    return sorted(first.values(), key=lambda source: shape_for_source(source).params)


def with_method(run: RunConfig, source: str, method: str) -> RunConfig:
    """The run with another model and method; QLoRA keeps the run's quantization when it is QLoRA already."""
    data = run.model_dump(mode="json")
    train = data["train"]
    keep = method == "qlora" and run.train.method == "qlora"
    train.update(method=method, quantization=run.train.quantization if keep else None)
    data["model"]["source"] = source
    return parse_run_config(data, f"comparison variant {source} {method}")


Pricer = Callable[[RunConfig, bool], CostReport]
"""(a variant of the run, preemptible) -> the stack priced with it."""


def stack_pricer(cfg: StackConfig, run: RunConfig, inputs: PriceInputs = PriceInputs()) -> Pricer:
    """`price_stack` for variants of `run`: the stack's configured throughput and the run it measured count only for
    the model and method they were set or measured for; preemptible prices every worker set preemptible."""
    training = cfg.pricing.training.model_copy(update={"tokens_per_second_per_gpu": None})
    plain = cfg.model_copy(update={"pricing": cfg.pricing.model_copy(update={"training": training})})
    unmeasured = inputs.model_copy(update={"training": None, "training_read_from": None})

    def spot(stack: StackConfig) -> StackConfig:
        workers = [w.model_copy(update={"preemptible": True}) for w in stack.nodes.workers]
        return stack.model_copy(update={"nodes": stack.nodes.model_copy(update={"workers": workers})})

    def price(variant: RunConfig, preemptible: bool) -> CostReport:
        key = (variant.model.source, variant.train.method)
        own = key == (run.model.source, run.train.method)
        measured = inputs.training is not None and (inputs.training.model, inputs.training.method) == key
        stack = cfg if own else plain
        return price_stack(spot(stack) if preemptible else stack, inputs if measured else unmeasured, run=variant)

    return price


def _row_throughput(report: CostReport) -> RowThroughput:
    found = report.plan.size if report.plan is not None else None
    if found is None or found.tokens_per_second_per_gpu is None:
        return RowThroughput(tokens_per_second_per_gpu=None, kind="unknown", basis="no figure to price it with")
    return RowThroughput(tokens_per_second_per_gpu=found.tokens_per_second_per_gpu, kind=found.throughput_kind,
                         basis=found.throughput_source, figure=found.throughput_figure, ratio=found.throughput_ratio)


def _has_preemptible_price(report: CostReport) -> bool:
    """Whether the (preemptible) workers were priced preemptible, not on demand for want of a figure."""
    return not any(line.note for line in report.monthly.lines if line.key.startswith("compute_worker"))


def reference_sized(cfg: StackConfig, run: RunConfig) -> tuple[StackConfig, RunConfig]:
    """The stack and run sized for REFERENCE_TOKENS in one pass (REFERENCE_ROWS rows of the tokens per row that make
    them, as pricing.training.avgTokensPerRow), for a run whose data has no size here."""
    per_row = REFERENCE_TOKENS / (REFERENCE_ROWS * run.data.split_ratio)
    training = cfg.pricing.training.model_copy(update={"avg_tokens_per_row": per_row})
    cfg = cfg.model_copy(update={"pricing": cfg.pricing.model_copy(update={"training": training})})
    data = run.data.model_copy(update={"rows": REFERENCE_ROWS})
    train = run.train.model_copy(update={"epochs": 1.0, "max_steps": None})
    return cfg, run.model_copy(update={"data": data, "train": train})


def compare(cfg: StackConfig, run: RunConfig, inputs: PriceInputs = PriceInputs()) -> MethodComparison:
    """The comparison table for a Nebius stack with a GPU worker set (see the module docstring); `inputs`: what the
    stack's runs measured, as `price_stack` takes them."""
    worker = next((w for w in (cfg.nodes.workers if cfg.nodes else []) if w.shape.gpus), None)
    if worker is None or cfg.target != "nebius":
        raise ValueError(f"stack {cfg.stack!r}: no priced GPU worker set to compare methods on")
    price = stack_pricer(cfg, run, inputs)
    sized = price(run, False).training
    if sized is None:
        cfg, run = reference_sized(cfg, run)
        price = stack_pricer(cfg, run, inputs)
        sized = price(run, False).training
        data_basis = "a reference size: the run config's data has no size here"
    else:
        data_basis = f"the run config's data: {sized.tokens:,.0f} tokens x {sized.epochs:g} passes"
    on = on_stack(plan_stack(cfg))
    assert on is not None  # a GPU worker set, found above
    has_spot = _has_preemptible_price(price(run, True))
    rows: list[CompareRow] = []
    usd_rate = spot_rate = None
    for source in compared_models(run):
        shape = shape_for_source(source)
        for method in METHODS:
            variant = with_method(run, source, method)
            on_demand = price(variant, False)
            priced = on_demand.training
            if usd_rate is None and priced.gpu_hours and priced.usd is not None:
                # a GPU-hour costs the same in every row (the stack's workers over its GPUs): priced once each way
                usd_rate = priced.usd / priced.gpu_hours
                spot = price(variant, True).training if has_spot else None
                spot_rate = spot.usd / spot.gpu_hours if spot and spot.usd is not None and spot.gpu_hours else None
            rows += _variant_rows(variant, shape, on_demand, spot_rate, on)
    return MethodComparison(
        stack=cfg.stack, gpu_model=on.gpu_model, gpu_memory_gib=on.node.gpu_memory_gib,
        gpus_per_node=on.gpus_per_node, node_ram_gib=on.node.host_memory_gib, stack_gpus=on.gpus, tokens=sized.tokens,
        passes=sized.epochs, data_basis=data_basis, usd_per_gpu_hour=usd_rate, preemptible_usd_per_gpu_hour=spot_rate,
        rows=rows, notes=_notes(on.platform, has_spot),
    )


def _variant_rows(variant: RunConfig, shape: ModelShape, on_demand: CostReport, spot_rate: float | None,
                  on: OnStack) -> list[CompareRow]:
    """One model and method: its plain row where it trains (with its network time), and its offload and HSDP rows
    where they apply, the one the trainer takes marked; the layouts are the planner's (planning.layouts)."""
    priced, throughput = on_demand.training, _row_throughput(on_demand)
    found = layouts(variant, shape, on, throughput.tokens_per_second_per_gpu)
    fit, host, wall_gpus = found.fit, found.host_bytes, found.wall_gpus
    preemptible = priced.gpu_hours * spot_rate if spot_rate is not None and priced.gpu_hours else None
    plain = CompareRow(
        model=variant.model.source, params_b=round(shape.params / 1e9, 2), method=variant.train.method,
        strategy=fit.plan.strategy if fit else None, gpus_needed=fit.gpus if fit else None,
        per_gpu_gib=round(fit.per_gpu_gib, 1) if fit else None, fits_stack=found.fits_stack,
        host_gib_per_node=round(host / GIB, 1) if host is not None else None,
        throughput=throughput, gpu_hours=priced.gpu_hours,
        wall_hours=priced.gpu_hours / wall_gpus if priced.gpu_hours is not None and wall_gpus else None,
        wall_gpus=wall_gpus, usd_on_demand=priced.usd, usd_preemptible=preemptible,
    )
    hsdp, bare = None, plain
    if found.spread is not None:
        hsdp = _hsdp_row(plain, variant, shape, found.spread, found.one_node, on.platform, on.gpu_model)
    if found.placed is not None:
        plain = _with_network(_on_gpus(plain, found.placed.gpus), variant, shape, found.placed, on.platform,
                              on.gpu_model)
    offloaded = _offload_row(bare, variant, shape, found.offloaded, on, spot_rate, found.chosen)
    return [_marked(r, found.chosen) for r in (plain, offloaded, hsdp) if r is not None]


def _notes(platform: str, has_spot: bool) -> list[str]:
    notes = ["FSDP rows are priced at the per-GPU throughput of the same model and method under DDP divided by their "
             "network slowdown; a measured FSDP run replaces that assumption",
             f"network: {NETWORK_MODEL}; fabric {catalog.FABRICS[platform].name}: {catalog.FABRICS[platform].source}",
             f"offload rows (FSDP CPU offload, train.offload: params) where they need fewer GPUs: {OFFLOAD_MODEL}",
             f"hsdp rows: sharding within each node and replicating across nodes on the same GPUs; auto keeps FSDP over "
             f"every rank, set {HSDP_SETTING} in the run config to train a row as HSDP"]
    if not has_spot:
        notes.append(f"{platform}: no preemptible price in the catalog; preemptible cost not shown")
    return notes














def _on_gpus(row: CompareRow, gpus: int) -> CompareRow:
    """`row` trained on `gpus` GPUs (its wall hours)."""
    hours = row.gpu_hours / gpus if row.gpu_hours is not None else None
    return row.model_copy(update={"wall_gpus": gpus, "wall_hours": hours})


def _marked(row: CompareRow, chosen: Placement | None) -> CompareRow:
    """`row` marked when its layout is the one the trainer takes on the stack (``fastest_nodes``)."""
    same = (chosen is not None and row.fits_stack and row.opt_in is None and row.strategy == chosen.plan.strategy
            and row.offload == chosen.plan.offload and row.wall_gpus == chosen.gpus)
    return row.model_copy(update={"chosen": same})




def _priced_network(row: CompareRow, moved: float, seconds: float | None, micro_batch_tokens: int,
                    bound: str) -> CompareRow:
    """`row` priced with `seconds` of network per micro-batch overlapped with its compute."""
    tps = row.throughput.tokens_per_second_per_gpu
    row = row.model_copy(update={"micro_batch_tokens": micro_batch_tokens, "network_bytes": moved})
    if not tps or moved == 0:
        return row.model_copy(update={"bound": bound})
    if seconds is None:
        return row.model_copy(update={"bound": f"{bound}, network unknown"})
    slowdown = max(1.0, seconds / (micro_batch_tokens / tps))
    update: dict[str, object] = {"bound": "network" if slowdown > 1 else bound, "network_slowdown": slowdown}
    if slowdown > 1 and row.gpu_hours is not None:
        gpu_hours = row.gpu_hours * slowdown
        update |= {
            "throughput": row.throughput.model_copy(update={"tokens_per_second_per_gpu": tps / slowdown}),
            "gpu_hours": gpu_hours, "wall_hours": gpu_hours / row.wall_gpus if row.wall_gpus else None,
            "usd_on_demand": row.usd_on_demand * slowdown if row.usd_on_demand is not None else None,
            "usd_preemptible": row.usd_preemptible * slowdown if row.usd_preemptible is not None else None,
        }
    return row.model_copy(update=update)


def _with_network(row: CompareRow, run: RunConfig, shape: ModelShape, placed: Placement, platform: str,
                  gpu_model: str) -> CompareRow:
    """The row priced with its network time where it trains (``NETWORK_MODEL``) and the bound it hits."""
    if placed.batches is None or gpu_model not in catalog.HOST_LINKS or gpu_model not in catalog.GPU_PEAKS:
        return row
    batches = placed.batches
    moved, seconds = network_seconds(run, shape, placed.plan.strategy, placed.nodes, placed.gpus_per_node,
                                     batches.gradient_accumulation_steps, platform, gpu_model)
    return _priced_network(row, moved, seconds, batches.micro_batch_tokens,
                           compute_bound(shape, gpu_model, batches.micro_batch_tokens))


HSDP_SETTING = "train.parallelism: hsdp"
"""what a run config sets to train an hsdp row (shard groups default to one node's ranks)."""


def _hsdp_row(plain: CompareRow, run: RunConfig, shape: ModelShape, placed: Placement, one: Placement | None,
              platform: str, gpu_model: str) -> CompareRow | None:
    """HSDP on `placed`'s GPUs (opt in: ``HSDP_SETTING``; shard groups of `one` node's GPUs), when they train FSDP
    over several nodes and one node holds the shards."""
    if (placed.plan.strategy != "fsdp" or placed.nodes < 2 or gpu_model not in catalog.HOST_LINKS
            or gpu_model not in catalog.GPU_PEAKS):
        return None
    if one is None or not one.fits or one.plan.strategy != "fsdp" or one.plan.offload != "none" or one.batches is None:
        return None
    mbt = one.batches.micro_batch_tokens
    moved, seconds = network_seconds(run, shape, "hsdp", placed.nodes, placed.gpus_per_node,
                                     one.batches.gradient_accumulation_steps, platform, gpu_model)
    row = plain.model_copy(update={"strategy": "hsdp", "opt_in": HSDP_SETTING, "gpus_needed": placed.gpus,
                                   "per_gpu_gib": round(one.per_gpu_gib, 1)})
    return _priced_network(row, moved, seconds, mbt, compute_bound(shape, gpu_model, mbt))
















def _offload_row(plain: CompareRow, run: RunConfig, shape: ModelShape, found: Placement | None, on: OnStack,
                 spot_rate: float | None, chosen: Placement | None = None) -> CompareRow | None:
    """The row with FSDP's CPU offload on the fewest nodes where it fits (`found`), when that is fewer GPUs than
    `plain`; on `chosen`'s nodes, with their network time, when the trainer takes offload there."""
    tps = plain.throughput.tokens_per_second_per_gpu
    gpu_model, platform, stack_gpus = on.gpu_model, on.platform, on.gpus
    if (plain.strategy != "fsdp" or not tps or plain.gpu_hours is None or gpu_model not in catalog.HOST_LINKS
            or platform not in catalog.HOST_MEMORY):
        return None
    if chosen is not None and chosen.plan.offload != "none" and found is not None and chosen.gpus <= stack_gpus:
        found = chosen
    if found is None or found.batches is None:
        return None
    slowdown = offload_slowdown(run, shape, gpu_model, platform, found.gpus, on.gpus_per_node, found.batches, tps)
    gpu_hours = plain.gpu_hours * slowdown
    usd_rate = plain.usd_on_demand / plain.gpu_hours if plain.usd_on_demand is not None and plain.gpu_hours else None
    fits_stack = found.gpus <= stack_gpus
    wall_gpus = found.gpus
    throughput = plain.throughput.model_copy(update={"tokens_per_second_per_gpu": tps / slowdown})
    bound = "host link" if slowdown > 1 else compute_bound(shape, gpu_model, found.batches.micro_batch_tokens)
    row = plain.model_copy(update={
        "strategy": "fsdp", "offload": "params", "slowdown": slowdown, "gpus_needed": found.gpus, "bound": bound,
        "micro_batch_tokens": found.batches.micro_batch_tokens,
        "per_gpu_gib": round(found.per_gpu_gib, 1), "fits_stack": fits_stack,
        "host_gib_per_node": round((found.host_bytes_per_node or 0) / GIB, 1), "throughput": throughput,
        "gpu_hours": gpu_hours, "wall_gpus": wall_gpus, "wall_hours": gpu_hours / wall_gpus,
        "usd_on_demand": gpu_hours * usd_rate if usd_rate is not None else None,
        "usd_preemptible": gpu_hours * spot_rate if spot_rate is not None else None,
    })
    if found.nodes < 2:
        return row
    networked = _with_network(row, run, shape, found, platform, gpu_model)
    return networked if networked.bound == "network" else networked.model_copy(update={"bound": bound})


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _on_stack(row: CompareRow, c: MethodComparison) -> str:
    if row.gpus_needed is None:
        return "-"
    if row.fits_stack:
        return "yes"
    if row.host_gib_per_node is not None and row.host_gib_per_node > c.node_ram_gib:
        return f"no: host RAM {c.node_ram_gib:g} GiB"
    return f"no: {math.ceil(row.gpus_needed / c.gpus_per_node)} nodes"


def _source(t: RowThroughput) -> str:
    return f"{t.kind} x{t.ratio:.3g}" if t.ratio is not None else t.kind


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.0f}"


def render_comparison(c: MethodComparison) -> str:
    price = f"${c.usd_per_gpu_hour:.2f}/GPU-hour" if c.usd_per_gpu_hour is not None else "no price"
    if c.preemptible_usd_per_gpu_hour is not None:
        price += f", preemptible ${c.preemptible_usd_per_gpu_hour:.2f}"
    gpus = f"{c.stack_gpus} GPU" + ("" if c.stack_gpus == 1 else "s")
    head = (f"Method comparison on {c.gpu_model} ({c.gpu_memory_gib:g} GiB usable; stack {c.stack!r}: {gpus}, {price}) "
            f"for {c.tokens * c.passes:,.0f} training tokens ({c.data_basis}):")
    table = [("Model", "Params", "Method", "Plan", "GPUs", "GiB/GPU", "Host GiB", "Bound", "On stack", "Tokens/s/GPU", "GPU-h",
              "Wall h", "On-demand", "Preemptible", "Tokens/s from")]
    for r in c.rows:
        mark = "*" if r.throughput.estimated else ""
        table.append((
            r.model.removeprefix("hub:"), f"{r.params_b:g}B", r.method,
            (r.strategy or "none") + ("+offload" if r.offload == "params" else "")
            + (" (opt-in)" if r.opt_in else "") + (" (chosen)" if r.chosen else ""),
            _num(r.gpus_needed, "d"), _num(r.per_gpu_gib, ".1f"),
            _num(r.host_gib_per_node, ",.0f"), r.bound or "-", _on_stack(r, c),
            _num(r.throughput.tokens_per_second_per_gpu, ",.0f") + mark, _num(r.gpu_hours, ",.1f"),
            _num(r.wall_hours, ",.1f"), _usd(r.usd_on_demand), _usd(r.usd_preemptible), _source(r.throughput),
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [head] + ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    figures = sorted({r.throughput.figure for r in c.rows if r.throughput.figure})
    lines += [f"  figure: {figure}" for figure in figures]
    lines.append("  * estimated: not measured on this GPU model, model and method; the figure scaled by the GPUs' "
                 "peaks and the work per token (planning/throughput.py; each row's scaling in --json)")
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def plot_comparison(c: MethodComparison, path: Path) -> None:
    """Cost on demand per model and method (PNG or SVG by the suffix); estimated figures hatched, runs that need
    more GPUs than the stack has drawn pale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    if not any(r.usd_on_demand for r in c.rows):
        raise ValueError("nothing to draw: no row has a cost (no throughput or no price known)")
    models = list(dict.fromkeys(r.model for r in c.rows))
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    width = 0.8 / len(METHODS)
    for i, method in enumerate(METHODS):
        for j, model in enumerate(models):
            row = next(r for r in c.rows if r.model == model and r.method == method)
            if row.usd_on_demand is not None:
                ax.bar(j + (i - 1) * width, row.usd_on_demand, width, color=f"C{i}",
                       alpha=1.0 if row.fits_stack else 0.35, hatch="//" if row.throughput.estimated else None)
    ax.set_xticks(range(len(models)), [m.removeprefix("hub:").split("/")[-1] for m in models])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"${value:,.0f}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"${value:,.0f}"))
    ax.set_ylabel("training-run cost on demand")
    ax.set_title(f"{c.stack}: {c.gpu_model}, {c.tokens * c.passes:,.0f} training tokens", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color=f"C{i}", label=method) for i, method in enumerate(METHODS)]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="//", label="tokens/s estimated"),
                Patch(color="grey", alpha=0.35, label="more GPUs than the stack has")]
    ax.legend(handles=handles, fontsize=8)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
