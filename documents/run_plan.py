"""The run plan (`run_plan.json`): what one planner (planning/planner.py) decided for a run on a stack, once. Per stage
the Slurm request; the training placement with the memory per rank behind it; what serving needs from the run; the
hours, node-hours and price of each stage with their basis. `ftstack plan` prints it (`--json` emits it), the chain
submits from it, the cost model and the policy pack read it, the trainer checks it against the hardware it got and
the run manifest records it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from documents.atomic import write_text_atomic
from documents.base import parse
from documents.train_plan import BatchPlan, ParallelismPlan

PLAN_ENV = "FT_RUN_PLAN"
"""the job variable holding the plan (its JSON) the train job was submitted with; the trainer reads it."""


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SlurmRequest(_Document):
    """What one stage's job asks Slurm for (None: not asked, the partition's or Slurm's default)."""

    partition: str | None = None
    nodes: int | None = Field(None, gt=0)
    gpus_per_node: int | None = Field(None, ge=0)
    ntasks_per_node: int | None = Field(None, gt=0)
    cpus_per_task: int | None = Field(None, gt=0)
    cpus_per_gpu: int | None = Field(None, gt=0)
    requeue: bool = True
    """False: --no-requeue (a train section that turns requeue off)."""
    time_limit_minutes: int | None = None
    """sbatch --time; None: the partition's limit (the server)."""

    def sbatch_args(self) -> list[str]:
        """The request as sbatch options (the time limit apart: the job resource passes --time itself)."""
        pairs = (("partition", self.partition), ("nodes", self.nodes), ("gpus-per-node", self.gpus_per_node),
                 ("ntasks-per-node", self.ntasks_per_node), ("cpus-per-task", self.cpus_per_task),
                 ("cpus-per-gpu", self.cpus_per_gpu))
        return [*([] if self.requeue else ["--no-requeue"]), *(f"--{k}={v}" for k, v in pairs if v is not None)]


class TrainingPlacement(_Document):
    """Where and how the run trains: the nodes and ranks, the hardware the plan assumed, DDP/FSDP/HSDP with its
    per-rank memory, the batch plan over it, and what the trainer may change at start."""

    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(ge=1)
    gpu_memory_gib: float | None
    """one GPU's memory the plan assumed, as PyTorch reports it (None: CPU)."""
    host_memory_gib: float | None
    """one node's RAM the plan assumed (None: not checked)."""
    parallelism: ParallelismPlan
    batches: BatchPlan | None
    """None: not one sequence per micro-batch fits (`why_not`)."""
    host_bytes_per_node: int | None = None
    fits: bool
    why_not: str | None = None
    adaptable: list[Literal["micro_batch_tokens", "gradient_checkpointing"]] = []
    """what the trainer may choose again on the GPU it got (the run config's `auto` settings); everything else must
    hold as planned."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class ServingPlan(_Document):
    """What serving needs from the run: the engine and the adapter rank it must accept."""

    engine: str
    adapter_rank: int | None
    """the run's own train.lora.r (None: a full fine-tune, no adapter)."""
    max_lora_rank: int = Field(gt=0)
    """the largest adapter rank the engine is started for (vLLM's --max-lora-rank, the peft engine's limit)."""
    basis: str
    fits: bool
    """the run's adapter rank is within max_lora_rank."""


class StageCost(_Document):
    """One stage's hours, the nodes it holds and its price, with their basis."""

    stage: str
    hours: float | None
    nodes: int
    gpus: int = 0
    node_hours: float | None
    usd_per_hour: float | None = None
    """the hour of the nodes it holds (None: no price here, an existing cluster or the local stack)."""
    usd: float | None = None
    basis: str
    measured_hours: float | None = None
    """the stage's elapsed hours in the newest stored run that timed it (RunPlan.stage_times_from); None: not timed."""


class TrainingSize(_Document):
    """The tokens a training run makes and the throughput it is timed with."""

    tokens: float
    epochs: float
    tokens_per_second_per_gpu: float | None
    throughput_kind: str
    """configured, measured, borrowed, estimated or unknown (planning.throughput.TrainingThroughput.kind)."""
    throughput_source: str
    throughput_figure: str | None = None
    """the measured figure the throughput is or was scaled from."""
    throughput_ratio: float | None = None
    """estimated: the scale applied to that figure."""


class RunPlan(_Document):
    stack: str
    target: str
    run: str
    stages: dict[str, SlurmRequest]
    training: TrainingPlacement | None = None
    """None: the model's shape is unknown here, or no train section."""
    size: TrainingSize | None = None
    tokens_per_second_per_gpu: float | None = None
    """the training throughput the training nodes were chosen at and the run is timed with (`size` repeats it where
    the data size is known); None: none known (no GPUs, no train section)."""
    serving: ServingPlan | None = None
    costs: list[StageCost] = []
    """prepare, readiness, train and eval (planning.planner.RUN_STAGES), in order."""
    stage_times_from: str | None = None
    """the stored run (and store) the stages' measured hours were read from; None: no run timed them."""
    notes: list[str] = []
    origin: Literal["planned", "job"] = "planned"
    """planned: by `ftstack`/the program before submission; job: by the trainer, submitted by hand without a plan."""

    def cost(self, stage: str) -> StageCost | None:
        return next((c for c in self.costs if c.stage == stage), None)

    def json_text(self) -> str:
        return self.model_dump_json(indent=2) + "\n"


def read_run_plan(text: str | bytes, origin: str) -> RunPlan:
    return parse(RunPlan, text, origin, "run plan")


def write_run_plan(plan: RunPlan, path: Path) -> Path:
    """The plan at `path`, written atomically."""
    write_text_atomic(path, plan.json_text())
    return path
