"""GPU readiness checks of every worker node before training; `python -m workloads.checks.gpu --help`.

Launched once per GPU (or per node) under srun, the ranks form one torch.distributed group
(NCCL on GPUs, gloo on CPU), measure their own GPUs, all-reduce across every node, and rank 0
writes one JSON report. The exit code is 0 only when no check failed, so a job that depends on
this one with afterok never starts on a bad node.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

from documents.atomic import write_text_atomic
from documents.run_config import load_run_config
from documents.readiness_report import GpuPerf, NodeInventory, ReadinessFloors, ReadinessReport
from documents.sections.readiness import ReadinessConfig
from workloads.checks import measure, node_states
from workloads.checks.environment import environment_checks
from workloads.checks.readiness import BUSBW_FLOORS_GBS, check_line, evaluate, floors_for

_FLAGS = {
    "expect_gpu_model": str,
    "expect_gpus_per_node": int,
    "expect_gpu_memory_gib": float,
    "interconnect": str,
    "max_temperature_c": float,
    "matmul_size": int,
    "bandwidth_mib": int,
    "allreduce_mib": int,
    "iterations": int,
    "min_busbw_gbs": float,
    "expect_cuda": str,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workloads.checks.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="run config JSON; its `readiness` section and results_dir are used")
    for name, kind in _FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    p.add_argument("--allow-cpu", action="store_true", default=None, help="pass on a node without GPUs")
    p.add_argument("--allow-drained-nodes", action="store_true", default=None,
                   help="go on although the partition has nodes the active checks drained")
    p.add_argument("--json-out", help="report path (default <results_dir>/readiness-<job id>.json with --config)")
    return p.parse_args(argv)


def settings(args: argparse.Namespace) -> tuple[ReadinessConfig, Path | None]:
    """The readiness config (run config section, then flags) and where the report goes."""
    base: dict = {}
    out = Path(args.json_out) if args.json_out else None
    if args.config:
        run = load_run_config(args.config)
        section = getattr(run, "readiness", None)
        base = section.model_dump() if section is not None else {}
        if out is None:
            out = Path(run.results_dir) / f"readiness-{os.environ.get('SLURM_JOB_ID', 'local')}.json"
    overrides = {k: getattr(args, k) for k in [*_FLAGS, "allow_cpu", "allow_drained_nodes"] if getattr(args, k) is not None}
    return ReadinessConfig.model_validate({**base, **overrides}), out


def rank_layout() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun or an srun step; (0, 1, 0) otherwise."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"]), int(env.get("SLURM_LOCALID", 0))
    return 0, 1, 0


def _master_addr() -> str:
    if "MASTER_ADDR" in os.environ:
        return os.environ["MASTER_ADDR"]
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if nodelist:
        hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return hosts.stdout.split()[0]
    return "127.0.0.1"


def _master_port() -> int:
    if "MASTER_PORT" in os.environ:
        return int(os.environ["MASTER_PORT"])
    return 20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000


def _gather(obj: object, world: int) -> list:
    if world == 1:
        return [obj]
    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _measure_gpus(readiness: ReadinessConfig, rank: int, local_rank: int, local_world: int) -> list[GpuPerf]:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    perf = []
    for index in range(local_rank % max(count, 1), count, local_world):
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        perf.append(
            GpuPerf(
                hostname=socket.gethostname(), rank=rank, device=index, name=torch.cuda.get_device_name(device),
                matmul_bf16_tflops=measure.matmul_tflops(device, torch.bfloat16, readiness.matmul_size,
                                                         readiness.iterations),
                matmul_fp16_tflops=measure.matmul_tflops(device, torch.float16, readiness.matmul_size,
                                                         readiness.iterations),
                memory_bandwidth_gbs=measure.memory_bandwidth_gbs(device, readiness.bandwidth_mib,
                                                                  readiness.iterations),
            )
        )
    return perf


def _merge_nodes(inventories: list[NodeInventory]) -> list[NodeInventory]:
    """One inventory per host: the fullest one its ranks reported."""
    best: dict[str, NodeInventory] = {}
    for inv in inventories:
        if inv.hostname not in best or len(inv.gpus) > len(best[inv.hostname].gpus):
            best[inv.hostname] = inv
    return list(best.values())


def run_checks(readiness: ReadinessConfig) -> ReadinessReport:
    """Measure on every rank, judge on rank 0; every rank returns the same report."""
    rank, world, local_rank = rank_layout()
    gpus = torch.cuda.is_available() and torch.cuda.device_count() > 0
    backend = "nccl" if gpus else "gloo"
    # What a rank learns alone comes before the group: the environment check imports peft and bitsandbytes, which
    # import torch._dynamo, and with torch 2.13 that import after init_process_group keeps the group alive past
    # destroy_process_group; its gloo worker threads then outlive main() and race the interpreter's exit
    # (std::terminate, "terminate called without an active exception": 5 of 108 runs of the 2-rank check here).
    code_dir = Path(__file__).resolve().parents[2]
    drained_here = node_states.job_check(readiness.allow_drained_nodes) if rank == 0 else None
    inventory = measure.inventory()
    environment_here = (environment_checks(code_dir, readiness.expect_cuda, gpus, readiness.allow_cpu)
                        if local_rank == 0 else [])
    if world > 1:
        if gpus:
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dist.init_process_group(
            backend, init_method=f"tcp://{_master_addr()}:{_master_port()}", rank=rank, world_size=world,
            timeout=dt.timedelta(minutes=5),
        )
    try:
        drained = _gather(drained_here, world)[0]
        hosts = _gather(socket.gethostname(), world)
        local_world = Counter(hosts)[socket.gethostname()]
        inventories = _gather(inventory, world)
        environment = [c for chunk in _gather(environment_here, world) for c in chunk]
        perf = [p for chunk in _gather(_measure_gpus(readiness, rank, local_rank, local_world), world) for p in chunk]
        device = torch.device("cuda", torch.cuda.current_device()) if gpus else torch.device("cpu")
        mib = readiness.allreduce_mib if gpus else min(readiness.allreduce_mib, 16)
        reduced = measure.allreduce(device, mib, readiness.iterations, len(set(hosts))) if world > 1 else None
        interconnect = readiness.interconnect or ("infiniband" if all(_gather(measure.infiniband_present(), world)) else "ethernet")
        nodes = _merge_nodes(inventories)
        checks = [drained, *evaluate(nodes, perf, reduced, readiness, interconnect), *environment]
        failed = [c for c in checks if c.status == "fail"]
        return ReadinessReport(
            ok=not failed,
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            world_size=world,
            backend=backend if world > 1 else None,
            interconnect=interconnect,
            config=readiness,
            floors=ReadinessFloors(
                gpu={p.name: floors_for(p.name) for p in perf},
                busbw_gbs=readiness.min_busbw_gbs or BUSBW_FLOORS_GBS[interconnect],
            ),
            nodes=nodes,
            measurements=perf,
            allreduce=reduced,
            checks=checks,
            failures=[check_line(c) for c in failed],
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def write_report(report: ReadinessReport, path: Path) -> None:
    write_text_atomic(path, report.model_dump_json(indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    readiness, out = settings(args)
    report = run_checks(readiness)
    if rank_layout()[0] == 0:
        for check in report.checks:
            print(check_line(check), flush=True)
        print(f"readiness: {'PASS' if report.ok else 'FAIL'} ({len(report.failures)} failed)", flush=True)
        if out is not None:
            write_report(report, out)
            print(f"readiness: report written to {out}", flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
