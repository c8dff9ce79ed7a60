"""Measurements on this node: GPU inventory (NVML, else nvidia-smi) and torch benchmarks."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from documents.readiness_report import AllReduceResult, GpuInfo, NodeInventory
from workloads.checks.readiness import bus_bandwidth, parse_nvidia_smi_csv

_SMI_QUERY = "index,uuid,name,memory.total,temperature.gpu,ecc.errors.uncorrected.volatile.total"


def inventory() -> NodeInventory:
    """This node's GPUs, driver and CUDA versions; source 'none' when neither NVML nor nvidia-smi answers."""
    host = socket.gethostname()
    torch_side = {
        "torch_cuda": torch.version.cuda,
        "torch_cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    found = _from_nvml() or _from_nvidia_smi()
    if found is None:
        return NodeInventory(hostname=host, source="none", **torch_side)
    source, gpus, driver, cuda = found
    return NodeInventory(hostname=host, source=source, gpus=gpus, driver_version=driver, cuda_version=cuda, **torch_side)


def _from_nvml() -> tuple[str, list[GpuInfo], str | None, str | None] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda_int = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                ecc = int(pynvml.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))
            except pynvml.NVMLError:
                ecc = None
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                    name=_text(pynvml.nvmlDeviceGetName(h)),
                    memory_total_mib=pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**20,
                    temperature_c=float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                    ecc_uncorrected=ecc,
                )
            )
        return "nvml", gpus, _text(driver), f"{cuda_int // 1000}.{cuda_int % 1000 // 10}"
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _from_nvidia_smi() -> tuple[str, list[GpuInfo], str | None, str | None] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    rows = subprocess.run([smi, f"--query-gpu={_SMI_QUERY}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=60)
    if rows.returncode != 0:
        return None
    header = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
    driver = re.search(r"Driver Version:\s*([\d.]+)", header)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return "nvidia-smi", parse_nvidia_smi_csv(rows.stdout), driver and driver.group(1), cuda and cuda.group(1)


def infiniband_present(sys_dir: str = "/sys/class/infiniband") -> bool:
    """True when an InfiniBand port is ACTIVE on this node."""
    return any("ACTIVE" in p.read_text() for p in Path(sys_dir).glob("*/ports/*/state"))


def seconds_per_call(fn: Callable[[], object], device: torch.device, iterations: int, warmup: int = 3) -> float:
    """Mean wall time of fn, synchronizing the GPU around the timed loop."""
    for _ in range(warmup):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    sync(device)
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    sync(device)
    return (time.perf_counter() - start) / iterations


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, iterations: int) -> float:
    """Dense n x n matmul throughput: 2 n^3 FLOP per call."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    return 2 * n**3 / seconds_per_call(lambda: torch.mm(a, b, out=c), device, iterations) / 1e12


def memory_bandwidth_gbs(device: torch.device, mib: int, iterations: int) -> float:
    """Device-memory copy bandwidth: each copy reads and writes the buffer once."""
    src = torch.empty(mib * 2**20 // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    return 2 * nbytes / seconds_per_call(lambda: dst.copy_(src), device, iterations) / 1e9


def allreduce(device: torch.device, mib: int, iterations: int, nodes: int) -> AllReduceResult:
    """Sum-all-reduce over the default process group: a correctness probe, then timed bandwidth."""
    world, rank = dist.get_world_size(), dist.get_rank()
    probe = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(probe)
    correct = bool(torch.all(probe == world * (world + 1) / 2).item())
    x = torch.ones(mib * 2**20 // 4, device=device, dtype=torch.float32)
    nbytes = x.numel() * 4
    dist.barrier()
    seconds = seconds_per_call(lambda: dist.all_reduce(x), device, iterations)
    times = torch.tensor([seconds], device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    seconds = float(times.item())
    algbw = nbytes / seconds / 1e9
    return AllReduceResult(
        backend=dist.get_backend(), world_size=world, nodes=nodes, size_bytes=nbytes, seconds=seconds,
        algbw_gbs=algbw, busbw_gbs=bus_bandwidth(algbw, world), correct=correct,
    )
