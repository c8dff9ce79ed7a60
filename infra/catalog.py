"""Nebius compute platforms and presets as data.

A preset name encodes its shape (``2gpu-64vcpu-384gb``: 2 GPUs, 64 vCPUs, 384 GiB RAM), so the
catalog lists names per platform and derives the numbers from them. Prices live in
``infra/cost/pricing.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping


_PRESET_RE = re.compile(r"^(?:(?P<gpus>\d+)gpu-)?(?P<vcpus>\d+)vcpu-(?P<ram>\d+)gb$")


class CatalogError(ValueError):
    """An unknown platform or preset."""


@dataclass(frozen=True)
class Preset:
    """One machine shape on a platform."""

    name: str
    gpus: int
    vcpus: int
    ram_gib: int
    gpu_cluster_compatible: bool


@dataclass(frozen=True)
class Platform:
    """A Nebius compute platform: one CPU family, optionally one GPU model."""

    name: str
    cpu: str
    gpu_model: str | None
    gpu_memory_gib: int
    presets: Mapping[str, Preset]
    drivers_preset: str | None = None
    """Default Nebius drivers preset of GPU node groups (mk8s ``gpu_settings.drivers_preset``)."""

    @property
    def is_gpu(self) -> bool:
        return self.gpu_model is not None


def parse_preset(name: str, *, gpu_cluster_gpus: int = 0) -> Preset:
    """Build a preset from its name; ``gpu_cluster_gpus`` is the GPU count that InfiniBand needs."""
    match = _PRESET_RE.match(name)
    if match is None:
        raise ValueError(f"preset name {name!r} is not of the form [Ngpu-]Nvcpu-Ngb")
    gpus = int(match["gpus"] or 0)
    return Preset(
        name=name,
        gpus=gpus,
        vcpus=int(match["vcpus"]),
        ram_gib=int(match["ram"]),
        gpu_cluster_compatible=gpu_cluster_gpus > 0 and gpus == gpu_cluster_gpus,
    )


def _platform(
    name: str, cpu: str, presets: tuple[str, ...], gpu_model: str | None = None,
    gpu_memory_gib: int = 0, gpu_cluster_gpus: int = 0,
) -> Platform:
    table = {p: parse_preset(p, gpu_cluster_gpus=gpu_cluster_gpus) for p in presets}
    drivers = CUDA12_DRIVERS if gpu_model else None
    return Platform(name, cpu, gpu_model, gpu_memory_gib, MappingProxyType(table), drivers)


CUDA12_DRIVERS = "cuda12"
"""Nebius drivers preset offered for L40S, H100 and H200 node groups on mk8s 1.30/1.31 (docs.nebius.com
kubernetes/gpu/set-up; ``nebius mk8s node-group get-compatibility-matrix`` lists the current ones)."""

_CPU_PRESETS = (
    "2vcpu-8gb", "4vcpu-16gb", "8vcpu-32gb", "16vcpu-64gb", "32vcpu-128gb", "48vcpu-192gb",
    "64vcpu-256gb", "96vcpu-384gb", "128vcpu-512gb", "160vcpu-640gb", "192vcpu-768gb",
    "224vcpu-896gb", "256vcpu-1024gb",
)
_HOPPER_PRESETS = ("1gpu-16vcpu-200gb", "8gpu-128vcpu-1600gb")

PLATFORMS: Mapping[str, Platform] = MappingProxyType({
    p.name: p
    for p in (
        _platform("cpu-d3", "AMD EPYC Genoa", _CPU_PRESETS),
        _platform("cpu-e2", "Intel Ice Lake", _CPU_PRESETS[:8]),
        _platform(
            "gpu-l40s-a", "Intel Ice Lake",
            ("1gpu-8vcpu-32gb", "1gpu-16vcpu-64gb", "1gpu-24vcpu-96gb", "1gpu-32vcpu-128gb",
             "1gpu-40vcpu-160gb"),
            gpu_model="NVIDIA L40S", gpu_memory_gib=48,
        ),
        _platform(
            "gpu-l40s-d", "AMD EPYC Genoa",
            ("1gpu-16vcpu-96gb", "1gpu-32vcpu-192gb", "1gpu-48vcpu-288gb", "2gpu-64vcpu-384gb",
             "2gpu-96vcpu-576gb", "4gpu-128vcpu-768gb", "4gpu-192vcpu-1152gb"),
            gpu_model="NVIDIA L40S", gpu_memory_gib=48,
        ),
        _platform(
            "gpu-h100-sxm", "Intel Sapphire Rapids", _HOPPER_PRESETS,
            gpu_model="NVIDIA H100 SXM", gpu_memory_gib=80, gpu_cluster_gpus=8,
        ),
        _platform(
            "gpu-h200-sxm", "Intel Sapphire Rapids", _HOPPER_PRESETS,
            gpu_model="NVIDIA H200 SXM", gpu_memory_gib=141, gpu_cluster_gpus=8,
        ),
    )
})


@dataclass(frozen=True)
class GpuPeaks:
    """A GPU model's published peaks: dense bf16 tensor FLOP/s (no sparsity) and memory bandwidth."""

    bf16_dense_tflops: float
    memory_tb_per_s: float
    source: str
    date: str
    """ISO date the figures were read."""

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound on this GPU."""
        return self.bf16_dense_tflops / self.memory_tb_per_s


_HALVED = "NVIDIA lists tensor FLOP/s with 2:4 sparsity; the dense figure is half"
GPU_PEAKS: Mapping[str, GpuPeaks] = MappingProxyType({
    "NVIDIA H100 SXM": GpuPeaks(
        989.4, 3.35, "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100), H100 SXM column: BFLOAT16 tensor "
        f"1,979 TFLOPS with sparsity, GPU memory bandwidth 3.35 TB/s; {_HALVED} (989.4 TFLOPS dense, as in "
        "glennklockwood.com/garden/processors/h100)", "2026-11-25"),
    "NVIDIA H200 SXM": GpuPeaks(
        989.4, 4.8, "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200), H200 SXM column: BFLOAT16 tensor "
        f"1,979 TFLOPS with sparsity (the H100's GH100 compute), GPU memory bandwidth 4.8 TB/s; {_HALVED}",
        "2026-11-25"),
    "NVIDIA L40S": GpuPeaks(
        362.05, 0.864, "NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s): BFLOAT16 tensor 362.05 TFLOPS "
        "(733 with sparsity), GPU memory bandwidth 864 GB/s", "2026-11-25"),
})
"""Read through reprints of NVIDIA's datasheet tables (the search tool reaches no nvidia.com page here)."""


def gpu_peaks(gpu_model: str) -> GpuPeaks:
    try:
        return GPU_PEAKS[gpu_model]
    except KeyError:
        raise CatalogError(f"no published peaks for GPU model {gpu_model!r}; known: {', '.join(GPU_PEAKS)}") from None


def gpu_memory_gib(gpu_model: str) -> int:
    """Memory of one GPU of this model, from the first platform that has it."""
    for platform in PLATFORMS.values():
        if platform.gpu_model == gpu_model:
            return platform.gpu_memory_gib
    raise CatalogError(f"no platform has GPU model {gpu_model!r}")


def get_platform(name: str) -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise CatalogError(f"unknown platform {name!r}; known: {', '.join(PLATFORMS)}") from None


def get_preset(platform: str, preset: str) -> Preset:
    plat = get_platform(platform)
    try:
        return plat.presets[preset]
    except KeyError:
        raise CatalogError(
            f"preset {preset!r} is not offered on {platform}; known: {', '.join(plat.presets)}"
        ) from None
