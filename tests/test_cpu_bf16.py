"""The CPU's native bf16, as the trainer and evaluator detect it, agrees with the kernel's own view of the CPU
(/proc/cpuinfo's flags, read independently of torch and cpuinfo); `auto` precision follows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from documents.sections.eval import EvalConfig
from workloads.common.bf16 import cpu_bf16_supported
from workloads.eval.evaluate import resolve_device_dtype
from workloads.train.config import detect_precision

CPUINFO = Path("/proc/cpuinfo")


def _kernel_flags() -> set[str]:
    for line in CPUINFO.read_text(encoding="utf-8").splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo has no flags line (not x86 Linux)")


def test_native_bf16_is_what_the_kernel_reports() -> None:
    flags = _kernel_flags()
    assert cpu_bf16_supported() == bool({"avx512_bf16", "amx_bf16"} & flags)


def test_auto_trains_and_evaluates_in_bf16_exactly_where_the_cpu_has_it() -> None:
    native = bool({"avx512_bf16", "amx_bf16"} & _kernel_flags())
    assert detect_precision("auto") == ("bf16" if native else "fp32")
    assert str(resolve_device_dtype(EvalConfig(device="cpu", dtype="auto"))[1]) == (
        "torch.bfloat16" if native else "torch.float32")
