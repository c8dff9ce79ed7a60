"""Pure readiness logic: GPU model keys, floors, bus bandwidth, nvidia-smi parsing, verdicts on synthetic data."""

from __future__ import annotations

import pytest

from documents.readiness_report import AllReduceResult, GpuInfo, GpuPerf, NodeInventory
from documents.sections.readiness import ReadinessConfig
from workloads.checks.readiness import (
    BANDWIDTH_FLOOR_FRACTION,
    GPU_SPECS,
    MATMUL_FLOOR_FRACTION,
    bus_bandwidth,
    evaluate,
    floors_for,
    gpu_key,
    parse_nvidia_smi_csv,
    same_model,
)

H100_NAME = "NVIDIA H100 80GB HBM3"
CFG = ReadinessConfig(expect_gpu_model="NVIDIA H100 SXM", expect_gpus_per_node=2, expect_gpu_memory_gib=80)


def _node(host: str = "w0", n: int = 2, name: str = H100_NAME, mib: float = 81559, temp: float = 40, ecc: int | None = 0):
    gpus = [GpuInfo(index=i, uuid=f"GPU-{host}-{i}", name=name, memory_total_mib=mib, temperature_c=temp, ecc_uncorrected=ecc)
            for i in range(n)]
    return NodeInventory(hostname=host, source="nvml", gpus=gpus, driver_version="550.90", cuda_version="12.4",
                         torch_cuda="12.4", torch_cuda_devices=n)


def _perf(host: str = "w0", device: int = 0, bf16: float = 700, fp16: float = 690, bw: float = 2900, name: str = H100_NAME):
    return GpuPerf(hostname=host, rank=device, device=device, name=name, matmul_bf16_tflops=bf16, matmul_fp16_tflops=fp16,
                   memory_bandwidth_gbs=bw)


def _reduce(busbw: float = 300, backend: str = "nccl", world: int = 4, correct: bool = True) -> AllReduceResult:
    return AllReduceResult(backend=backend, world_size=world, nodes=2, size_bytes=2**28, seconds=0.01,
                           algbw_gbs=busbw * world / (2 * (world - 1)), busbw_gbs=busbw, correct=correct)


def _failed(checks) -> list[str]:
    return sorted(f"{c.name}@{c.node}/{c.gpu}" for c in checks if c.status == "fail")


@pytest.mark.parametrize(
    ("name", "key"),
    [(H100_NAME, "H100"), ("NVIDIA H100 SXM", "H100"), ("NVIDIA H100 PCIe", None), ("NVIDIA L40S", "L40S"),
     ("NVIDIA H200", "H200"), ("Tesla T4", None)],
)
def test_gpu_key(name: str, key: str | None) -> None:
    assert gpu_key(name) == key


def test_same_model_uses_keys_then_text() -> None:
    assert same_model(H100_NAME, "NVIDIA H100 SXM") and same_model("NVIDIA L40S", "l40s")
    assert not same_model("NVIDIA L40S", "NVIDIA H100 SXM")
    assert same_model("Tesla T4", "T4") and not same_model("Tesla T4", "A10")


def test_floors_are_fractions_of_datasheet_peaks() -> None:
    floors = floors_for("NVIDIA L40S")
    spec = GPU_SPECS["L40S"]
    assert floors["matmul_bf16_tflops"] == pytest.approx(spec.bf16_tflops * MATMUL_FLOOR_FRACTION)
    assert floors["memory_bandwidth_gbs"] == pytest.approx(spec.memory_bandwidth_gbs * BANDWIDTH_FLOOR_FRACTION)
    assert floors_for("NVIDIA H200")["memory_bandwidth_gbs"] > floors_for(H100_NAME)["memory_bandwidth_gbs"]
    assert floors_for("Tesla T4") is None


def test_bus_bandwidth_follows_nccl_tests() -> None:
    assert bus_bandwidth(100.0, 2) == pytest.approx(100.0)
    assert bus_bandwidth(100.0, 8) == pytest.approx(175.0)
    assert bus_bandwidth(100.0, 1) == 0.0


def test_parse_nvidia_smi_csv_handles_not_available() -> None:
    text = "0, GPU-a, NVIDIA L40S, 46068, 35, 0\n1, GPU-b, NVIDIA L40S, 46068, [N/A], [N/A]\n\n"
    gpus = parse_nvidia_smi_csv(text)
    assert [(g.index, g.memory_total_mib, g.temperature_c, g.ecc_uncorrected) for g in gpus] == [
        (0, 46068.0, 35.0, 0), (1, 46068.0, None, None)]


def test_healthy_cluster_passes() -> None:
    nodes = [_node("w0"), _node("w1")]
    perf = [_perf(h, d) for h in ("w0", "w1") for d in (0, 1)]
    checks = evaluate(nodes, perf, _reduce(), CFG, "infiniband")
    assert _failed(checks) == []
    names = {c.name for c in checks}
    assert {"gpu_present", "gpu_count", "gpu_model", "gpu_memory", "temperature", "ecc_errors", "matmul_bf16_tflops",
            "matmul_fp16_tflops", "memory_bandwidth_gbs", "allreduce_busbw", "driver", "cuda_usable"} <= names


def test_each_bad_measurement_fails_its_own_check() -> None:
    nodes = [_node("w0"), _node("w1", n=1), _node("w2", ecc=3, temp=91)]
    perf = [_perf("w0", 0, bf16=300), _perf("w0", 1, bw=1500)]
    checks = evaluate(nodes, perf, _reduce(busbw=40), CFG, "infiniband")
    assert _failed(checks) == [
        "allreduce_busbw@None/None", "ecc_errors@w2/0", "ecc_errors@w2/1", "gpu_count@w1/None",
        "matmul_bf16_tflops@w0/0", "memory_bandwidth_gbs@w0/1", "temperature@w2/0", "temperature@w2/1"]
    busbw = next(c for c in checks if c.name == "allreduce_busbw")
    assert busbw.threshold == 100.0
    assert evaluate(nodes[:1], [], _reduce(busbw=40), CFG, "ethernet")[-1].status == "pass"
    assert evaluate(nodes[:1], [], _reduce(busbw=40), CFG.model_copy(update={"min_busbw_gbs": 50}), "ethernet")[-1].status == "fail"


def test_wrong_model_and_small_memory_fail_l40s_memory_passes() -> None:
    l40s = _node(name="NVIDIA L40S", mib=46068)
    cfg = ReadinessConfig(expect_gpu_model="NVIDIA L40S", expect_gpus_per_node=2, expect_gpu_memory_gib=48)
    assert _failed(evaluate([l40s], [], None, cfg, "ethernet")) == []
    assert _failed(evaluate([l40s], [], None, CFG, "ethernet")) == [
        "gpu_memory@w0/0", "gpu_memory@w0/1", "gpu_model@w0/0", "gpu_model@w0/1"]


def test_unknown_model_perf_is_information_only() -> None:
    checks = evaluate([], [_perf(bf16=1, name="Tesla T4")], None, ReadinessConfig(), "ethernet")
    assert {c.status for c in checks if c.name.startswith(("matmul", "memory"))} == {"info"}


def test_no_gpu_fails_unless_cpu_allowed_and_torch_must_see_gpus() -> None:
    cpu = NodeInventory(hostname="vm", source="none")
    assert _failed(evaluate([cpu], [], None, CFG, "ethernet")) == ["gpu_present@vm/None"]
    allowed = CFG.model_copy(update={"allow_cpu": True})
    checks = evaluate([cpu], [], None, allowed, "ethernet")
    assert _failed(checks) == [] and next(c for c in checks if c.name == "gpu_present").status == "skip"
    blind = _node().model_copy(update={"torch_cuda_devices": 0})
    assert _failed(evaluate([blind], [], None, CFG, "ethernet")) == ["cuda_usable@w0/None"]


def test_allreduce_verdicts() -> None:
    assert evaluate([], [], None, CFG, "ethernet")[-1].status == "skip"
    assert evaluate([], [], _reduce(backend="gloo", busbw=0.5), CFG, "ethernet")[-1].status == "info"
    assert evaluate([], [], _reduce(correct=False), CFG, "infiniband")[-1].status == "fail"
