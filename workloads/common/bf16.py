"""Whether this machine's CPU computes bf16 natively: AVX-512 BF16 or AMX-BF16 (torch.cpu.get_capabilities, read
by cpuinfo), where oneDNN's bf16 kernels run and a bf16 matmul takes about half the time of an fp32 one (the demo's
QLoRA steps 1.5x as fast, its evaluation twice as fast, on a 2-core Sapphire Rapids); without them bf16 is emulated
and slower than fp32, so CPUs without them stay in fp32."""

from __future__ import annotations

NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def cpu_bf16_supported() -> bool:
    import torch

    capabilities = torch.cpu.get_capabilities()
    return any(bool(capabilities.get(name, False)) for name in NATIVE_BF16)
