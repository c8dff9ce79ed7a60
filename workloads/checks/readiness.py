"""Pure parts of the GPU readiness checks: the per-model floors and the verdict on measurements.

Floors are fractions of datasheet peaks (dense tensor-core TFLOP/s, HBM/GDDR bandwidth), low enough
that a healthy GPU clears them with margin and a throttled, mis-clocked or degraded one does not.

The report rank 0 writes is `documents.readiness_report.ReadinessReport`.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from documents.readiness_report import AllReduceResult, CheckResult, GpuInfo, GpuPerf, NodeInventory
from documents.sections.readiness import ReadinessConfig

MATMUL_FLOOR_FRACTION = 0.40
BANDWIDTH_FLOOR_FRACTION = 0.70
MEMORY_TOLERANCE = 0.90


class GpuSpec(BaseModel):
    """Datasheet peaks of one GPU model (dense, no sparsity)."""

    model_config = ConfigDict(frozen=True)

    bf16_tflops: float
    fp16_tflops: float
    memory_bandwidth_gbs: float
    memory_gb: float


GPU_SPECS: dict[str, GpuSpec] = {
    "L40S": GpuSpec(bf16_tflops=362.05, fp16_tflops=362.05, memory_bandwidth_gbs=864.0, memory_gb=48),
    "H100": GpuSpec(bf16_tflops=989.4, fp16_tflops=989.4, memory_bandwidth_gbs=3350.0, memory_gb=80),
    "H200": GpuSpec(bf16_tflops=989.4, fp16_tflops=989.4, memory_bandwidth_gbs=4800.0, memory_gb=141),
}

BUSBW_FLOORS_GBS: dict[str, float] = {"infiniband": 100.0, "ethernet": 1.0}


def check_line(check: CheckResult) -> str:
    """One check as the job log prints it: name [node/gpu]: status value unit (threshold) - detail."""
    where = "/".join(str(x) for x in (check.node, check.gpu) if x is not None)
    value = "" if check.value is None else f" {check.value}{' ' + check.unit if check.unit else ''}"
    limit = "" if check.threshold is None else f" (threshold {check.threshold})"
    return f"{check.name}{' [' + where + ']' if where else ''}: {check.status}{value}{limit}{' - ' + check.detail if check.detail else ''}"


def gpu_key(name: str) -> str | None:
    """The table key of a GPU name ('NVIDIA H100 80GB HBM3' -> 'H100'); PCIe/NVL H100 variants have none."""
    upper = name.upper()
    if "L40S" in upper:
        return "L40S"
    if "H200" in upper:
        return "H200"
    if "H100" in upper:
        return None if ("PCIE" in upper or "NVL" in upper) else "H100"
    return None


def same_model(actual: str, expected: str) -> bool:
    key_a, key_e = gpu_key(actual), gpu_key(expected)
    if key_a and key_e:
        return key_a == key_e
    return re.sub(r"\W", "", expected.upper()) in re.sub(r"\W", "", actual.upper())


def floors_for(name: str) -> dict[str, float] | None:
    """{matmul_bf16_tflops, matmul_fp16_tflops, memory_bandwidth_gbs} floors of a GPU, None if unknown."""
    spec = GPU_SPECS.get(gpu_key(name) or "")
    if spec is None:
        return None
    return {
        "matmul_bf16_tflops": spec.bf16_tflops * MATMUL_FLOOR_FRACTION,
        "matmul_fp16_tflops": spec.fp16_tflops * MATMUL_FLOOR_FRACTION,
        "memory_bandwidth_gbs": spec.memory_bandwidth_gbs * BANDWIDTH_FLOOR_FRACTION,
    }


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """nccl-tests all-reduce bus bandwidth: algbw * 2(n-1)/n."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 0 else 0.0


def parse_nvidia_smi_csv(text: str) -> list[GpuInfo]:
    """Rows of `nvidia-smi --query-gpu=index,uuid,name,memory.total,temperature.gpu,
    ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits`."""
    gpus = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0].strip():
            continue
        index, uuid, name, memory, temp, ecc = (c.strip() for c in row[:6])
        gpus.append(
            GpuInfo(
                index=int(index),
                uuid=uuid,
                name=name,
                memory_total_mib=float(memory),
                temperature_c=_number(temp),
                ecc_uncorrected=int(_number(ecc)) if _number(ecc) is not None else None,
            )
        )
    return gpus


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def evaluate(
    nodes: Iterable[NodeInventory],
    perf: Iterable[GpuPerf],
    allreduce: AllReduceResult | None,
    readiness: ReadinessConfig,
    interconnect: str,
) -> list[CheckResult]:
    """Every check on the gathered measurements; a run is ready when none has status 'fail'."""
    checks: list[CheckResult] = []
    for node in nodes:
        checks += _node_checks(node, readiness)
    for p in perf:
        checks += _perf_checks(p)
    checks.append(_allreduce_check(allreduce, readiness, interconnect))
    return checks


def _node_checks(node: NodeInventory, readiness: ReadinessConfig) -> list[CheckResult]:
    host = node.hostname
    out = [
        CheckResult(
            name="driver", status="info", node=host,
            value=f"driver {node.driver_version or '-'} CUDA {node.cuda_version or '-'} torch CUDA {node.torch_cuda or '-'}",
            detail=f"inventory from {node.source}",
        )
    ]
    if not node.gpus:
        if readiness.allow_cpu:
            return out + [CheckResult(name="gpu_present", status="skip", node=host, value=0, detail="no GPU; allowed by allow_cpu")]
        return out + [CheckResult(name="gpu_present", status="fail", node=host, value=0, detail="no GPU found (NVML and nvidia-smi)")]
    out.append(CheckResult(name="gpu_present", status="pass", node=host, value=len(node.gpus)))
    usable = node.torch_cuda_devices > 0
    out.append(
        CheckResult(
            name="cuda_usable", status="pass" if usable else "fail", node=host, value=node.torch_cuda_devices,
            detail="" if usable else "torch sees no CUDA device although GPUs are present (driver/CUDA mismatch?)",
        )
    )
    if readiness.expect_gpus_per_node is not None:
        ok = len(node.gpus) == readiness.expect_gpus_per_node
        out.append(CheckResult(name="gpu_count", status="pass" if ok else "fail", node=host, value=len(node.gpus),
                               threshold=readiness.expect_gpus_per_node))
    for gpu in node.gpus:
        out += _gpu_checks(host, gpu, readiness)
    return out


def _gpu_checks(host: str, gpu: GpuInfo, readiness: ReadinessConfig) -> list[CheckResult]:
    out = []
    if readiness.expect_gpu_model:
        ok = same_model(gpu.name, readiness.expect_gpu_model)
        out.append(CheckResult(name="gpu_model", status="pass" if ok else "fail", node=host, gpu=gpu.index,
                               value=gpu.name, threshold=readiness.expect_gpu_model))
    if readiness.expect_gpu_memory_gib:
        gib = gpu.memory_total_mib / 1024
        need = readiness.expect_gpu_memory_gib * MEMORY_TOLERANCE
        out.append(CheckResult(name="gpu_memory", status="pass" if gib >= need else "fail", node=host, gpu=gpu.index,
                               value=round(gib, 2), threshold=round(need, 2), unit="GiB"))
    if gpu.temperature_c is None:
        out.append(CheckResult(name="temperature", status="skip", node=host, gpu=gpu.index, detail="not reported"))
    else:
        ok = gpu.temperature_c <= readiness.max_temperature_c
        out.append(CheckResult(name="temperature", status="pass" if ok else "fail", node=host, gpu=gpu.index,
                               value=gpu.temperature_c, threshold=readiness.max_temperature_c, unit="C"))
    if gpu.ecc_uncorrected is None:
        out.append(CheckResult(name="ecc_errors", status="skip", node=host, gpu=gpu.index, detail="ECC off or not reported"))
    else:
        out.append(CheckResult(name="ecc_errors", status="pass" if gpu.ecc_uncorrected == 0 else "fail", node=host,
                               gpu=gpu.index, value=gpu.ecc_uncorrected, threshold=0, detail="uncorrected, volatile"))
    return out


def _perf_checks(p: GpuPerf) -> list[CheckResult]:
    floors = floors_for(p.name)
    units = {"matmul_bf16_tflops": "TFLOP/s", "matmul_fp16_tflops": "TFLOP/s", "memory_bandwidth_gbs": "GB/s"}
    out = []
    for metric, unit in units.items():
        value = getattr(p, metric)
        if floors is None:
            out.append(CheckResult(name=metric, status="info", node=p.hostname, gpu=p.device, value=round(value, 2),
                                   unit=unit, detail=f"no floor for {p.name}"))
            continue
        floor = floors[metric]
        out.append(CheckResult(name=metric, status="pass" if value >= floor else "fail", node=p.hostname, gpu=p.device,
                               value=round(value, 2), threshold=round(floor, 2), unit=unit))
    return out


def _allreduce_check(result: AllReduceResult | None, readiness: ReadinessConfig, interconnect: str) -> CheckResult:
    if result is None or result.world_size < 2:
        return CheckResult(name="allreduce_busbw", status="skip", detail="one rank: nothing to all-reduce across")
    value = round(result.busbw_gbs, 3)
    where = f"{result.backend}, {result.world_size} ranks on {result.nodes} node(s)"
    if not result.correct:
        return CheckResult(name="allreduce_busbw", status="fail", value=value, unit="GB/s", detail=f"wrong sum ({where})")
    if result.backend != "nccl":
        return CheckResult(name="allreduce_busbw", status="info", value=value, unit="GB/s",
                           detail=f"{where}; CPU plumbing only, no floor")
    floor = readiness.min_busbw_gbs or BUSBW_FLOORS_GBS[interconnect]
    return CheckResult(name="allreduce_busbw", status="pass" if value >= floor else "fail", value=value, threshold=floor,
                       unit="GB/s", detail=f"{where}, {interconnect}")
