"""The CPU optimizer step of FSDP's CPU offload, measured on this machine (issue 39): `torch.optim.AdamW` over fp32
parameters on the CPU against a plain copy of the same tensors, printed as JSON.

The method comparison prices that step as 28 B of memory traffic per parameter (AdamW reads the parameter, its
gradient and both moments, writes the parameter and the moments) at a socket's peak memory bandwidth
(`infra/cost/method_comparison.py` OFFLOAD_MODEL, `planning/catalog.py` HOST_MEMORY). This shows how close torch's AdamW comes to
the bandwidth a copy reaches here: `adamw_over_copy` below 1 means the priced step is that much too short.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (tokenize.py); keep it off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

ADAMW_BYTES_PER_PARAM = 28
COPY_BYTES_PER_PARAM = 8


def _best(repeats: int, run) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=20_000_000, help="fp32 parameters stepped (default 20M)")
    parser.add_argument("--tensors", type=int, default=8, help="tensors they are split into")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; the fastest is reported")
    args = parser.parse_args()
    per_tensor = max(1, args.params // args.tensors)
    count = per_tensor * args.tensors
    params = [torch.nn.Parameter(torch.randn(per_tensor)) for _ in range(args.tensors)]
    for parameter in params:
        parameter.grad = torch.randn(per_tensor)
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    optimizer.step()  # allocates the moments
    step = _best(args.repeats, optimizer.step)
    source, target = torch.randn(count), torch.empty(count)
    copy = _best(args.repeats, lambda: target.copy_(source))
    adamw = count * ADAMW_BYTES_PER_PARAM / step / 1e9
    copied = count * COPY_BYTES_PER_PARAM / copy / 1e9
    print(json.dumps({
        "params": count, "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "adamw_step_seconds": step, "adamw_params_per_second": count / step,
        "adamw_gb_per_s_at_28_bytes": adamw, "copy_gb_per_s": copied, "adamw_over_copy": adamw / copied,
    }, indent=2))


if __name__ == "__main__":
    main()
