"""The `eval` section of the run config."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from documents.sections.strict import Count, Flag, Number


class EvalConfig(BaseModel):
    """How the evaluator compares the base and the fine-tuned model on the test split."""

    model_config = ConfigDict(extra="forbid")

    finetuned: Literal["auto", "merged", "adapter"] = Field(
        "auto", description="fine-tuned side: merged folder, adapter on the base, or auto (merged if present)"
    )
    perplexity_rows: Count | None = Field(None, gt=0, description="test rows for perplexity (None: all)")
    batch_size: Count = Field(8, gt=0, description="rows per forward pass for perplexity")
    num_prompts: Count = Field(20, gt=0, description="test prompts used for generation metrics")
    num_samples: Count = Field(3, ge=0, description="sample_generations kept in the report")
    max_new_tokens: Count = Field(128, gt=0, description="generation limit per prompt (greedy)")
    generation_batch_size: Count = Field(16, gt=0, description="prompts generated together (left-padded batches)")
    timing_runs: Count = Field(3, gt=0, description="prompts generated one at a time and timed after a warm-up (the "
                             "first ones); speed and time to first token are their medians")
    numeric_tolerance: Number = Field(0.01, ge=0.0, description="numeric match: largest relative difference accepted")
    seed: Count = Field(0, ge=0, description="torch seed before each model's generation")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 on GPU and on a CPU with AVX-512 BF16 or AMX, else float32"
    )
    chart: Flag = Field(True, description="write the comparison chart PNG beside the JSON")
