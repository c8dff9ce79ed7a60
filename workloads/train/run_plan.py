"""The plan a training job trains with: the one it was submitted with (`FT_RUN_PLAN`, set by the chain), else, for a
job submitted by hand (`sbatch` as the docs show), one the job makes with the same planner from the nodes it got.
What it got (torchrun's ranks, the GPU's memory as PyTorch reports it, the node's RAM) is read here; the comparison
is planning.job_check's."""

from __future__ import annotations

import os

import torch

from documents.run_config import RunConfig
from documents.run_plan import PLAN_ENV, RunPlan, read_run_plan
from planning.job_check import JobHardware
from planning.model_shapes import ModelShape
from planning.planner import plan_run
from planning.stack import ExistingNodes, PlanStack

JOB_STACK = "sbatch"
"""the stack name of a plan the job made itself (no stack config reaches the job)."""


def gpu_memory_gib() -> float | None:
    """Total memory of this process's GPU as PyTorch reports it (None on CPU)."""
    if not torch.cuda.is_available():
        return None
    index = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.cuda.get_device_properties(index).total_memory / 2**30


def job_hardware() -> JobHardware:
    """What this job got: WORLD_SIZE ranks, LOCAL_WORLD_SIZE per node, this GPU's memory, this node's RAM."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return JobHardware(world_size=world, ranks_per_node=per_node, gpu_memory_gib=gpu_memory_gib(),
                       host_memory_gib=ram)


def job_made_plan(run: RunConfig, shape: ModelShape | None, got: JobHardware) -> RunPlan:
    """The plan of a job submitted without one: the planner over the nodes the job got, as an existing cluster."""
    gpus = got.ranks_per_node if got.gpu_memory_gib is not None else 0
    nodes = ExistingNodes(nodes=got.nodes, gpus_per_node=gpus, cpus_per_node=os.cpu_count() or 1,
                          memory_gib_per_node=got.host_memory_gib or 1.0, gpu_memory_gib=got.gpu_memory_gib)
    stack = PlanStack(stack=JOB_STACK, target="cluster", cluster=nodes)
    return plan_run(stack, run, shape=shape).model_copy(update={"origin": "job"})


def submitted_plan(run: RunConfig, shape: ModelShape | None, got: JobHardware) -> RunPlan:
    """The plan the job was submitted with (PLAN_ENV), else the one it makes (`job_made_plan`)."""
    text = os.environ.get(PLAN_ENV)
    if text:
        return read_run_plan(text, f"${PLAN_ENV}")
    return job_made_plan(run, shape, got)
