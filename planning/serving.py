"""What serving needs from a run: the engine and the adapter rank it must accept. The limit (vLLM's
--max-lora-rank, the peft engine's) is the smallest rank vLLM takes that holds the run's own `train.lora.r` and every
stored run the server loads, unless `serve.max_lora_rank` sets it; a run whose rank the set limit cannot take is
refused before anything is submitted (planning.planner.refusals)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from documents.run_config import RunConfig
from documents.run_manifest import RunManifest
from documents.run_plan import ServingPlan
from documents.sections.serve import VLLM_LORA_RANKS, ServeConfig
from documents.sections.train import LoraSettings

DEFAULT_RANK: int = LoraSettings.model_fields["r"].default
"""the one default adapter rank: what training produces when the run config names none."""


def trained_rank(run: RunConfig) -> int | None:
    """The rank of the adapter the run trains (None: a full fine-tune or no train section)."""
    if run.train is None or run.train.method == "full":
        return None
    return run.train.lora.r


def manifest_rank(manifest: RunManifest) -> int:
    """The adapter rank a stored run trained (its manifest's train.lora.r; the default rank where it names none)."""
    return ((manifest.config.get("train") or {}).get("lora") or {}).get("r", DEFAULT_RANK)


def served_ranks(run: RunConfig, others: Iterable[int] = ()) -> list[int]:
    """The adapter ranks a server started for `run` must take: the run's own (where it trains an adapter), then
    `others` (the adapters it serves, the stored runs it may load)."""
    own = trained_rank(run)
    return [*([own] if own is not None else []), *others]


def derived_rank(ranks: Sequence[int]) -> int:
    """The smallest rank vLLM's --max-lora-rank takes that holds every one of `ranks` (the default rank when none);
    the largest it takes where none does (refused then)."""
    needed = max(ranks, default=DEFAULT_RANK)
    return next((r for r in VLLM_LORA_RANKS if r >= needed), VLLM_LORA_RANKS[-1])


def rank_limit(configured: int | None, ranks: Sequence[int]) -> int:
    """The engine's rank limit: serve.max_lora_rank where set, else the one `derived_rank` gives `ranks`."""
    return configured if configured is not None else derived_rank(ranks)


def serving_plan(run: RunConfig, stored_ranks: Sequence[int] = ()) -> ServingPlan:
    """The engine and the rank limit the server is started with for this run (module docstring)."""
    serve = run.serve or ServeConfig()
    own = trained_rank(run)
    ranks = served_ranks(run, stored_ranks)
    configured = serve.max_lora_rank
    limit = rank_limit(configured, ranks)
    needed = max(ranks, default=0)
    where = f"serve.max_lora_rank {configured}" if configured is not None else "derived from the adapters served"
    basis = (f"largest adapter rank {needed} (train.lora.r {own}"
             f"{f', stored runs up to {max(stored_ranks)}' if stored_ranks else ''}); limit {limit}, {where}")
    if needed > limit:
        basis = (f"LoRA rank {needed} is over serve.max_lora_rank {limit} (vLLM --max-lora-rank): the adapter could "
                 f"be trained but not served; set serve.max_lora_rank to {derived_rank(ranks)} or unset it")
    return ServingPlan(engine=serve.engine, adapter_rank=own, max_lora_rank=limit, basis=basis, fits=needed <= limit)
