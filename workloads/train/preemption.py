"""Stop cleanly when Slurm asks: SIGTERM / SIGUSR1 in a training process, or a stop file written by the batch
script. All ranks agree on the same step, save a checkpoint there and leave the training loop."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist
from transformers import TrainerCallback

log = logging.getLogger("workloads.train.preemption")

STOP_FILE_ENV = "FT_STOP_FILE"
INTERRUPTED_EXIT = 75


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on any (an all-reduce; the flag itself in a single process)."""
    value = torch.tensor([1.0 if flag else 0.0])
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "nccl":
            value = value.cuda()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item() > 0


class StopRequest:
    """Set by a signal or by the presence of a stop file."""

    def __init__(self, stop_file: str | None) -> None:
        self.stop_file = Path(stop_file) if stop_file else None
        self.signal: int | None = None
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal is None:
            log.warning("received %s: checkpoint at the end of this step, then stop", signal.Signals(signum).name)
        self.signal = signum

    def requested(self) -> bool:
        return self.signal is not None or bool(self.stop_file and self.stop_file.exists())


class PreemptionCallback(TrainerCallback):
    """At every step end, any rank's stop request stops all ranks after a checkpoint at that step."""

    def __init__(self, request: StopRequest) -> None:
        self.request = request
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 - TrainerCallback signature
        if any_rank(self.request.requested()) and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
            log.warning("stop requested: saving checkpoint at step %d", state.global_step)
        return control
