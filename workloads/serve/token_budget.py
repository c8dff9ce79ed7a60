"""How many tokens one request may hold (prompt plus reply): the model's context and, when its size is fixed, the
engine's KV cache. The launcher plans each route's budget from it; the gateway counts prompts against it
(workloads.serve.gateway.prompt_counter); the CPU engine reads the model's context from it. No HTTP.

A `transformers serve` engine's continuous-batching worker dies for good on a request its KV cache cannot
hold; a prompt past the model's context is garbage at best. The gateway counts the prompt with the model's
own tokenizer and chat template and refuses what does not fit with a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from documents.base import DocumentError
from documents.hf_files import read_decoder_config
from documents.sections.serve import ServeConfig

# transformers' continuous batching pages hold 256 tokens (ContinuousBatchingConfig.page_size); the engines are
# started without --cb-block-size, so --cb-num-blocks N is a cache of N x 256 tokens.
CB_PAGE_TOKENS = 256


def model_context(folder: Path) -> int | None:
    """The model's position limit from its config.json (text_config for multimodal models), if it states one."""
    try:
        value = read_decoder_config(folder).max_position_embeddings
    except DocumentError:
        return None
    return value if value is not None and value > 0 else None


@dataclass(frozen=True)
class TokenBudget:
    """The most tokens (prompt plus reply) one request may use, and what sets that limit."""

    tokens: int
    reason: str


def token_budget(folder: Path, serve_config: ServeConfig) -> TokenBudget | None:
    """The smaller of the model's context and, when its size is fixed, the engine's KV cache."""
    limits = []
    if (context := model_context(folder)) is not None:
        limits.append(TokenBudget(context, "the model's context"))
    if serve_config.continuous_batching and serve_config.cb_num_blocks is not None:
        blocks = serve_config.cb_num_blocks
        limits.append(TokenBudget(blocks * CB_PAGE_TOKENS,
                                  f"the engine's KV cache ({blocks} blocks of {CB_PAGE_TOKENS} tokens)"))
    return min(limits, key=lambda b: b.tokens) if limits else None
