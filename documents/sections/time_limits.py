"""The `time_limits` section of a run config: each stage's Slurm time limit (`sbatch --time`), in minutes.

Training's requeue signal (USR1, 120 s before the limit) fires only before a limit, so every stage has one.
Training's limit follows the cost model's estimate of the run's wall time where there is one:
``ceil(estimate x train_margin) + train_overhead_minutes``; else `train_default_minutes` (seed 001's 6 hours).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from documents.sections.strict import Count, Number

MAX_MINUTES = 366 * 24 * 60
"""The longest limit a stage may have: a year (Slurm takes up to 0xfffffffe minutes, slurm.h `time_limit`, uint32;
no job here runs for more than days, so a larger figure is a typo)."""


class TimeLimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    environment_minutes: Count = Field(60, ge=1, le=MAX_MINUTES,
                                     description="building the environment from the lock on one node")
    prepare_minutes: Count = Field(120, ge=1, le=MAX_MINUTES,
                                 description="model download and conversion, data convert, split, tokenize")
    readiness_minutes: Count = Field(30, ge=1, le=MAX_MINUTES, description="the readiness checks on every worker")
    train_minutes: Count | None = Field(None, ge=1, le=MAX_MINUTES,
                                      description="training's limit; null: from the training estimate")
    train_default_minutes: Count = Field(360, ge=1, le=MAX_MINUTES,
                                       description="training's limit where the cost model has no estimate")
    train_margin: Number = Field(1.5, ge=1.0, le=10.0, description="factor on the estimated training wall time")
    train_overhead_minutes: Count = Field(30, ge=0, le=MAX_MINUTES,
                                        description="added to the estimate: model load, checkpoints, merge")
    eval_minutes: Count = Field(120, ge=1, le=MAX_MINUTES, description="the evaluation of base and fine-tuned model")
    publish_minutes: Count = Field(15, ge=1, le=MAX_MINUTES,
                                 description="loading a passed fine-tune into the running server")
    serve_minutes: Count | None = Field(None, ge=1, le=MAX_MINUTES,
                                      description="the server's limit; null: none (it runs until stopped)")
