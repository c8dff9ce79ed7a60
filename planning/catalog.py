"""Nebius compute platforms and presets as data.

A preset name encodes its shape (``2gpu-64vcpu-384gb``: 2 GPUs, 64 vCPUs, 384 GiB RAM), so the
catalog lists names per platform and derives the numbers from them. Prices live in
``planning/prices.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping

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
    """nominal memory per GPU as the preset states it (what readiness checks against); plans use
    ``usable_gpu_memory_gib``."""
    presets: Mapping[str, Preset]
    drivers_preset: str | None = None
    """Default Nebius drivers preset of GPU node groups (mk8s ``gpu_settings.drivers_preset``)."""
    cuda_version: str | None = None
    """Default CUDA version (X.Y.Z) Soperator's images use on this platform (the charts' ``cudaVersion``)."""

    @property
    def is_gpu(self) -> bool:
        return self.gpu_model is not None

    @property
    def usable_gpu_memory_gib(self) -> float:
        """Memory of one GPU as PyTorch reports it (``USABLE_GPU_MEMORY``); 0 for a CPU platform."""
        return usable_gpu_memory(self.gpu_model).gib if self.gpu_model else 0.0


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
    drivers, cuda = (DEFAULT_DRIVERS_PRESET, DEFAULT_CUDA_VERSION) if gpu_model else (None, None)
    return Platform(name, cpu, gpu_model, gpu_memory_gib, MappingProxyType(table), drivers, cuda)


REFERENCE_DRIVER_PRESETS = (
    "nebius/nebius-solutions-library soperator/installations/example/driver_presets.tf "
    "(commit 9a187732a69e500115f78a088dc2ceb3981540e3, newest stored revision, read 2026-11-25)"
)
"""Where ``SUPPORTED_DRIVER_PRESETS_BY_K8S`` comes from: the reference install's table that its
``check_driver_presets`` preconditions validate a plan against."""

SUPPORTED_DRIVER_PRESETS_BY_K8S: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType({
    version: MappingProxyType({platform: ("cuda13.0",) for platform in platforms})
    for version, platforms in {
        "1.35": ("gpu-l40s-a", "gpu-l40s-d", "gpu-h100-sxm", "gpu-h200-sxm", "gpu-b200-sxm", "gpu-b200-sxm-a",
                 "gpu-b300-sxm", "gpu-rtx6000", "gpu-gb300"),
        "1.36": ("gpu-l40s-a", "gpu-l40s-d", "gpu-h100-sxm", "gpu-h200-sxm", "gpu-b200-sxm", "gpu-b200-sxm-a",
                 "gpu-b300-sxm", "gpu-rtx6000", "gpu-rtx6000-a", "gpu-gb300"),
    }.items()
})
"""Managed Kubernetes version -> GPU platform -> drivers presets with preinstalled GPU node images
(``supported_gpu_driver_presets_by_k8s`` of ``REFERENCE_DRIVER_PRESETS``; an older revision listed 1.32 and
1.33, none lists 1.31)."""

DEFAULT_DRIVERS_PRESET = "cuda13.0"
DEFAULT_CUDA_VERSION = "13.0.2"
"""The reference's per-platform defaults for every GPU platform (``platform_driver_presets`` and
``platform_cuda_versions`` in soperator/installations/example/variables.tf, commit
01e8c67a6182305bf2751a931fc5ee2f642f51a1, read 2026-11-25)."""

SOPERATOR_CUDA_VERSIONS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "4.1.7": ("12.9.0", "13.0.2"),
})
"""CUDA versions a Soperator release ships active-check images and NCCL tests for (nebius/soperator at the
tag: helm/soperator-activechecks/values.yaml ``images.activeCheckImageTags`` and ``ncclTestsVersions``); the
chart fails to render for any other ``cudaVersion``."""


def supported_pairs() -> str:
    """The table as one line: ``1.35: gpu-h100-sxm cuda13.0, ...; 1.36: ...`` (for error messages)."""
    return "; ".join(
        f"{version}: " + ", ".join(f"{platform} {'/'.join(presets)}" for platform, presets in platforms.items())
        for version, platforms in SUPPORTED_DRIVER_PRESETS_BY_K8S.items()
    )

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


REFERENCE_CPU_TOPOLOGY = (
    "nebius/nebius-solution-library soperator/modules/available_resources/cpu_topology.tf "
    "(commit 8924ec08abff722f97ceedbc7189046f4ef11a55, the same file as nebius/nebius-solutions-library commit "
    "c1e21829140ab91a9021432c662546a77e5178af; read 2026-11-28)"
)


@dataclass(frozen=True)
class CpuTopology:
    """A VM's CPU layout as Slurm's node line states it (``Boards SocketsPerBoard CoresPerSocket ThreadsPerCore``).

    ``kind``: ``reference``, from ``REFERENCE_CPU_TOPOLOGY``; ``derived``, a preset the reference does not list, laid
    out like its listed presets of the same CPU family (see ``CPU_TOPOLOGIES``), not read on such a VM."""

    boards: int
    sockets_per_board: int
    cores_per_socket: int
    threads_per_core: int
    kind: Literal["reference", "derived"]

    @property
    def cpus(self) -> int:
        return self.boards * self.sockets_per_board * self.cores_per_socket * self.threads_per_core

    def slurm(self) -> str:
        """``CPUs=.. Boards=.. SocketsPerBoard=.. CoresPerSocket=.. ThreadsPerCore=..`` as the reference writes it."""
        return (f"CPUs={self.cpus} Boards={self.boards} SocketsPerBoard={self.sockets_per_board} "
                f"CoresPerSocket={self.cores_per_socket} ThreadsPerCore={self.threads_per_core}")


def _layout(vcpus: int, sockets: int, kind: Literal["reference", "derived"] = "reference") -> CpuTopology:
    """Two hardware threads per core, the vCPUs split evenly over ``sockets`` (every entry of the reference)."""
    return CpuTopology(1, sockets, vcpus // sockets // 2, 2, kind)


def _family_layout(preset: str, two_sockets_from: int, kind: Literal["reference", "derived"]) -> CpuTopology:
    vcpus = parse_preset(preset).vcpus
    return _layout(vcpus, 2 if vcpus >= two_sockets_from else 1, kind)


_GENOA_TWO_SOCKETS_FROM, _ICE_LAKE_TWO_SOCKETS_FROM = 160, 48
"""The reference lays cpu-d3 (AMD Genoa) out on one socket up to 128 vCPUs and on two from 160, cpu-e2 (Intel Ice
Lake) on one socket up to 32 vCPUs and on two from 48 (48vcpu-192gb: 2 x 12 cores on e2, 1 x 24 on d3)."""
_REFERENCE_E2 = {"2vcpu-8gb", "4vcpu-16gb", "8vcpu-32gb", "16vcpu-64gb", "32vcpu-128gb", "48vcpu-192gb", "64vcpu-256gb"}

CPU_TOPOLOGIES: Mapping[tuple[str, str], CpuTopology] = MappingProxyType({
    **{("cpu-d3", p): _family_layout(p, _GENOA_TWO_SOCKETS_FROM, "reference") for p in _CPU_PRESETS},
    **{("cpu-e2", p): _family_layout(p, _ICE_LAKE_TWO_SOCKETS_FROM, "reference" if p in _REFERENCE_E2 else "derived")
       for p in _CPU_PRESETS[:8]},
    **{(hopper, p): _family_layout(p, 128, "reference") for hopper in ("gpu-h100-sxm", "gpu-h200-sxm")
       for p in _HOPPER_PRESETS},
    **{("gpu-l40s-d", p): _family_layout(p, _GENOA_TWO_SOCKETS_FROM, "derived")
       for p in PLATFORMS["gpu-l40s-d"].presets},
    **{("gpu-l40s-a", p): _family_layout(p, _ICE_LAKE_TWO_SOCKETS_FROM, "derived")
       for p in PLATFORMS["gpu-l40s-a"].presets},
})
"""(platform, preset) -> CPU topology. ``reference``: ``REFERENCE_CPU_TOPOLOGY`` lists it (cpu-d3 every preset;
cpu-e2 up to 64 vCPUs, it has no 96vcpu-384gb; gpu-h100-sxm and gpu-h200-sxm: 1gpu-16vcpu-200gb 1 x 8 x 2,
8gpu-128vcpu-1600gb 2 x 32 x 2). ``derived``: the reference lists no L40S platform; gpu-l40s-d (AMD Genoa) is laid out
like cpu-d3 and gpu-l40s-a (Intel Ice Lake) like cpu-e2, by vCPU count. Slurm drains a node whose line states more
CPUs, cores or threads per core than slurmd finds, so a derived entry is to be checked with ``slurmd -C`` on the VM."""

REFERENCE_GRES_NAMES = (
    "Slurm's NVML GPU type name (the device name lowercased, spaces as underscores), as the reference's "
    "soperator/modules/available_resources/gres.tf gres_by_platforms lists it (nebius/nebius-solution-library "
    "commit 5ee7a6268fa2a4bfd2e995aa880aa147f46b85aa for H100/H200; the L40S entries in a later stored revision)"
)
GRES_NAMES: Mapping[str, str] = MappingProxyType({
    "gpu-h100-sxm": "nvidia_h100_80gb_hbm3",
    "gpu-h200-sxm": "nvidia_h200",
    "gpu-l40s-a": "nvidia_l40s",
    "gpu-l40s-d": "nvidia_l40s",
})
"""GPU platform -> the ``Gres=gpu:<name>:<n>`` type (``REFERENCE_GRES_NAMES``)."""


def cpu_topology(platform: str, preset: str) -> CpuTopology:
    get_preset(platform, preset)
    try:
        return CPU_TOPOLOGIES[(platform, preset)]
    except KeyError:
        raise CatalogError(f"no CPU topology known for {platform} {preset}; add it to catalog.CPU_TOPOLOGIES") from None


def gres_name(platform: str) -> str:
    try:
        return GRES_NAMES[platform]
    except KeyError:
        known = ", ".join(GRES_NAMES)
        raise CatalogError(f"no Slurm GPU type known for platform {platform!r}; known: {known}") from None


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


@dataclass(frozen=True)
class HostLink:
    """How a GPU reaches host memory and its peers: PCIe bandwidth per direction, and whether peers talk over
    NVLink (else their all-gathers cross PCIe too)."""

    pcie_gb_per_s: float
    nvlink: bool
    source: str
    nvlink_gb_per_s: float = 0.0

    @property
    def peer_gb_per_s(self) -> float:
        """Bandwidth to another GPU of the same node, per direction."""
        return self.nvlink_gb_per_s if self.nvlink else self.pcie_gb_per_s


HOST_LINKS: Mapping[str, HostLink] = MappingProxyType({
    "NVIDIA H100 SXM": HostLink(64.0, True, "NVIDIA H100 datasheet, SXM column: PCIe Gen5 128 GB/s (both "
                                "directions; 64 each), NVLink 900 GB/s (450 each)", 450.0),
    "NVIDIA H200 SXM": HostLink(64.0, True, "NVIDIA H200 datasheet, SXM column: PCIe Gen5 128 GB/s (both "
                                "directions; 64 each), NVLink 900 GB/s (450 each)", 450.0),
    "NVIDIA L40S": HostLink(32.0, False, "NVIDIA L40S datasheet: PCIe Gen4 x16 64 GB/s bidirectional (32 each way), "
                            "NVLink: no"),
})
"""Read through the same reprints of NVIDIA's datasheets as ``GPU_PEAKS`` (2026-11-25)."""


@dataclass(frozen=True)
class Fabric:
    """The network between a platform's nodes, per direction (None: no sourced figure). ``per: gpu``: one link per
    GPU (InfiniBand, a ConnectX-7 each); ``per: node``: one link the node's GPUs share (Ethernet)."""

    name: str
    gb_per_s: float | None
    per: Literal["gpu", "node"]
    source: str

    @property
    def ring_gb_per_s(self) -> float | None:
        """What one ring collective over every rank crosses nodes at: its slowest link, a GPU's own NIC or the
        node's one NIC (a ring leaves each node once)."""
        return self.gb_per_s

    def node_gb_per_s(self, gpus_per_node: int) -> float | None:
        """What one node sends at when all its GPUs talk across nodes at once (HSDP's gradient all-reduces)."""
        if self.gb_per_s is None:
            return None
        return self.gb_per_s * gpus_per_node if self.per == "gpu" else self.gb_per_s


_IB = Fabric("InfiniBand NDR", 50.0, "gpu", "one ConnectX-7 NDR 400 Gbit/s per GPU (Nebius' 8-GPU nodes: '8x "
             "ConnectX-7 IB NDR 400Gb/s', mlcommons/inference_results_v6.0 closed/Nebius/systems/nebius_b200_n1.json; "
             "a 2 x 8 H100 Nebius cluster measured 435 GB/s NCCL all-reduce at 1 GB, github.com/drmysore/"
             "nebius-h100-16gpu-benchmark README)")
_L40S_ETHERNET = Fabric(
    "Ethernet (TCP)", 1.45, "node", "measured, not published: NCCL all_reduce_perf between two Nebius L40S VMs "
    "(gpu-l40s-a, preset 1gpu-8vcpu-32gb, one GPU each, TCP over eth0: no InfiniBand on L40S platforms) peaked at "
    "1.45 GB/s bus bandwidth from 32 MB to 128 MB (alanlaird/alanlaird.github.io "
    "_posts/2026-03-04-nebius-gpu-benchmarking.md; the run's Terraform: alanlaird/gpulabs nebius/nccl-docker); "
    "Nebius publishes no per-VM Ethernet bandwidth; a larger preset or gpu-l40s-d may get more, not measured")
FABRICS: Mapping[str, Fabric] = MappingProxyType({
    "gpu-h100-sxm": _IB,
    "gpu-h200-sxm": _IB,
    "gpu-l40s-a": _L40S_ETHERNET,
    "gpu-l40s-d": _L40S_ETHERNET,
})
"""Read 2026-11-25 (L40S: 2026-11-26)."""


@dataclass(frozen=True)
class HostMemory:
    """Peak memory bandwidth of one CPU socket of a platform (channels x transfers/s x 8 B), what FSDP's CPU
    offload runs the optimizer step against; a VM gets at most this."""

    gb_per_s: float
    source: str


HOST_MEMORY: Mapping[str, HostMemory] = MappingProxyType({
    "gpu-l40s-a": HostMemory(204.8, "Intel Xeon Ice Lake-SP: 8 channels DDR4-3200 per socket (8 x 3,200 MT/s x 8 B)"),
    "gpu-l40s-d": HostMemory(460.8, "AMD EPYC 9004 (Genoa) datasheet: 12 channels DDR5-4800 per socket, 460.8 GB/s"),
    "gpu-h100-sxm": HostMemory(307.2, "Intel Xeon Sapphire Rapids: 8 channels DDR5-4800 per socket "
                               "(8 x 4,800 MT/s x 8 B)"),
    "gpu-h200-sxm": HostMemory(307.2, "Intel Xeon Sapphire Rapids: 8 channels DDR5-4800 per socket "
                               "(8 x 4,800 MT/s x 8 B)"),
})
"""The CPU families of ``PLATFORMS``; read 2026-11-26."""


def gpu_peaks(gpu_model: str) -> GpuPeaks:
    try:
        return GPU_PEAKS[gpu_model]
    except KeyError:
        raise CatalogError(f"no published peaks for GPU model {gpu_model!r}; known: {', '.join(GPU_PEAKS)}") from None


@dataclass(frozen=True)
class UsableMemory:
    """Memory of one GPU as PyTorch reports it (``torch.cuda.get_device_properties(i).total_memory``): what the
    plan, the policy, the comparison and the trainer size a run against."""

    gib: float
    kind: Literal["measured", "derived"]
    """measured: read on such a GPU; derived: computed from the datasheet and a measured sibling, not read."""
    source: str


USABLE_GPU_MEMORY: Mapping[str, UsableMemory] = MappingProxyType({
    "NVIDIA H100 SXM": UsableMemory(
        79.19, "measured", "torch.cuda.get_device_properties(0).total_memory on an H100 80GB HBM3, 2026-11-23 "
        "(docs/training.md, the Qwen3-14B QLoRA sizing run); the same 79.19 per GPU in a Nebius H100 acceptance "
        "run (github.com/drmysore/nebius-h100-16gpu-benchmark README)"),
    "NVIDIA L40S": UsableMemory(
        44.99, "derived", "48,305,799,168 B (44.99 GiB), an L40S's memoryTotal as NVML reported it in a public run "
        "record (huggingface.co/apjanco/es_qwen2_vl_pangea wandb-metadata.json, read 2026-11-25; datasheet: 48 GB "
        "GDDR6 with ECC); not yet measured by this project's readiness checks"),
    "NVIDIA H200 SXM": UsableMemory(
        140.19, "derived", "the datasheet's 141 GB less the H100's measured shortfall from its nominal 80 (0.81 GiB); "
        "not measured"),
})


def usable_gpu_memory(gpu_model: str) -> UsableMemory:
    try:
        return USABLE_GPU_MEMORY[gpu_model]
    except KeyError:
        raise CatalogError(
            f"no usable memory known for GPU model {gpu_model!r}; known: {', '.join(USABLE_GPU_MEMORY)}") from None


def gpu_memory_gib(gpu_model: str) -> float:
    """Usable memory of one GPU of this model (``USABLE_GPU_MEMORY``), the figure every plan sizes with."""
    return usable_gpu_memory(gpu_model).gib


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
