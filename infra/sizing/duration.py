"""A run's training wall time on a stack (training's time limit follows from it): tokens x passes over the
throughput of the GPUs it trains on. Nothing is priced here."""

from __future__ import annotations

from documents.run_config import RunConfig
from documents.throughput import ThroughputMeasurement
from infra.config import StackConfig
from infra.sizing.run_size import passes, training_devices, training_tokens
from infra.sizing.throughput import training_throughput

SECONDS_PER_HOUR = 3600


def estimated_train_hours(stack: StackConfig, run: RunConfig,
                          measured: ThroughputMeasurement | None = None) -> float | None:
    """Training's wall hours: one pass's tokens x the passes the run makes, over the throughput per GPU (the stack's
    configured figure, the run it `measured`, else the estimate) x the GPUs the train job spreads over; None on the
    local stack or where the data size, the throughput or the GPUs are unknown."""
    if stack.target == "local":
        return None
    notes: list[str] = []
    size = training_tokens(stack, run, None, notes)
    throughput = training_throughput(stack, run, measured)
    gpus, _ = training_devices(stack, run, measured)
    if size is None or throughput is None or not gpus:
        return None
    tokens, rows = size
    epochs = passes(run.train, tokens, rows, gpus, run.max_length, notes)
    return tokens * epochs / (throughput.tokens_per_second_per_gpu * gpus) / SECONDS_PER_HOUR
