"""The `serve` section of the run config."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from documents.names import StackName
from documents.sections.strict import Count, Flag, Number

MODEL_NAME_MAX = 64
"""characters in a served model id: OpenAI's fine-tuned model suffixes stop at 64."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""the values vLLM's --max-lora-rank accepts (vllm/config/lora.py `MaxLoRARanks`, v0.13.0 to v0.32.0)"""
MODEL_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MODEL_NAME_MAX - 1}}}$")


def shown(text: str, limit: int = 80) -> str:
    """`text` quoted for a message, at most its first `limit` characters (and its length when cut)."""
    return repr(text[:limit]) + (f"... ({len(text)} characters)" if len(text) > limit else "")


def model_name_problem(name: str) -> str | None:
    """Why `name` cannot be a served model id (too long, or characters beyond letters, digits, `.`, `_`, `-`),
    quoting at most its first 80 characters; None when it can."""
    if MODEL_NAME.match(name):
        return None
    shown_name = shown(name)
    if len(name) > MODEL_NAME_MAX:
        return f"is {len(name)} characters long; a model name has at most {MODEL_NAME_MAX}: {shown_name}"
    return f"must start with a letter or digit and hold only letters, digits, '.', '_' and '-': {shown_name}"


class ServeConfig(BaseModel):
    """The OpenAI-compatible endpoint: engine, models, address and access."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["auto", "transformers", "vllm", "peft"] = Field(
        "auto", description="auto: vLLM when installed and a GPU is present, else peft (one base, adapters "
                            "per request); transformers: `transformers serve`, a merged copy per fine-tune"
    )
    host: str = Field("127.0.0.1", description="gateway listen address; beyond loopback an API key is required")
    port: Count = Field(8000, ge=1, le=65535, description="gateway port")
    backend_port: Count = Field(8100, ge=1024, le=65000, description="first loopback port for engine processes")
    serve_base: Flag = Field(True, description="also serve the base model (name `base_name`)")
    base_name: str = Field("base", description="model id of the base model in /v1/models")
    finetuned_name: str = Field("finetuned", description="model id of the fine-tuned model in /v1/models")
    adapters: dict[str, str] = Field(
        default_factory=dict, description="name -> stored run id of each adapter to serve (none: the run's own, "
                                          "as `finetuned_name`); `--adapter NAME=RUN_ID` adds to it")
    runs_store: str = Field(".local/artifacts", description="the run store folder the adapters' runs are read from")
    publish_min_perplexity_improvement_pct: Number = Field(
        0.0, description="the publish job's gate: a fine-tune is loaded into the running server when its eval "
                         "measured at least this perplexity improvement over the base (%, the report's comparison)")
    stack: StackName | None = Field(
        None, description="the stack this server serves: stored runs are read from runs/<stack>/ of the store only "
                          "(the pipeline's serve job passes --stack; without one, stored runs are refused)")
    max_loras: Count = Field(8, ge=1, description="adapters one server holds at most (vLLM --max-cpu-loras)")
    max_loras_per_batch: Count = Field(
        4, ge=1, description="vLLM --max-loras: adapters one batch mixes (a GPU slot each); at most max_loras")
    max_lora_rank: Count | None = Field(
        None,
        description="vLLM --max-lora-rank: the largest adapter rank the server takes, at start or loaded later; unset: "
                    "the smallest rank vLLM takes that holds the run's own train.lora.r, the adapters served at start "
                    "and the stored runs the server may load (planning/serving.py); set, an adapter over it is "
                    "refused naming both, and ftstack plan refuses a run whose own rank is over it")
    vllm_python: str | None = Field(
        None, description="the serving environment's interpreter, which holds vLLM (None: the launcher's own); "
                          "vLLM's version and command are read from it")
    max_batch: Count = Field(16, ge=1, description="peft engine: requests decoded together")
    api_key_env: str = Field("FT_API_KEY", description="environment variable holding the API key (never the key)")
    continuous_batching: Flag = Field(True, description="transformers engine: continuous batching")
    cb_num_blocks: Count | None = Field(None, gt=0, description="KV cache blocks per engine (None: from memory)")
    cb_max_batch_tokens: Count | None = Field(None, gt=0, description="tokens per batch (None: from memory)")
    cb_max_memory_percent: Number | None = Field(
        None, gt=0.0, le=1.0,
        description="share of free memory for the KV cache; on CPU 0.1 per engine unless blocks are given",
    )
    device: str = Field("auto", description="transformers engine: device (auto, cpu, cuda:0)")
    dtype: str = Field("auto", description="transformers engine: dtype (auto, float32, bfloat16, float16)")
    vllm_args: list[str] = Field(default_factory=list, description="extra arguments for `vllm serve`")
    startup_timeout_s: Number = Field(600.0, gt=0, description="how long to wait for the engines to be healthy")
    max_tokens_limit: Count = Field(
        2000, gt=0, description="largest max_tokens a request may ask for; a request without one gets this much "
                                "(or what its prompt leaves of the model's context or KV cache); also the output "
                                "tokens a chat is priced at (seed 000: 2K output)",
    )
    max_body_bytes: Count = Field(1 << 20, gt=0, description="largest request body; a larger one gets 413")
    max_engine_restarts: Count = Field(
        3, ge=0, description="restarts (with backoff) of an engine that exits or whose worker dies; one more "
                             "failure ends the launcher non-zero, so Slurm sees the job fail",
    )
    shutdown_grace_s: Number = Field(
        10.0, gt=0, description="on SIGTERM: seconds for requests in flight, then as long for the engines before SIGKILL",
    )

    @field_validator("base_name", "finetuned_name")
    @classmethod
    def _name(cls, value: str) -> str:
        if problem := model_name_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("max_lora_rank")
    @classmethod
    def _vllm_rank(cls, value: int | None) -> int | None:
        if value is not None and value not in VLLM_LORA_RANKS:
            raise ValueError(f"{value} is no rank vLLM's --max-lora-rank takes: one of {', '.join(map(str, VLLM_LORA_RANKS))}")
        return value

    @field_validator("adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if problem := model_name_problem(name):
                raise ValueError(f"adapter name {problem}")
        return value
