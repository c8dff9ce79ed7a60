"""FSDP2 (`torch.distributed.fsdp.fully_shard`) over the training model, before the Trainer sees it.

Groups, innermost first: each decoder layer's LoRA adapter (trainable, fp32), then the decoder layer itself (the
frozen base, or every weight under a full fine-tune), then the root (embeddings, LM head, final norm). Keeping the
trainable adapter out of the frozen base's group gives each group one dtype and lets the base skip gradient
reduction. On a GPU the mixed precision policy gathers parameters in the compute dtype and reduces gradients in
fp32; a bitsandbytes 4-bit base shards because it is stored in the compute dtype (`bnb_4bit_quant_storage`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder blocks: modules of the classes transformers never splits across devices (also once
    sharded, when FSDP has swapped in a subclass)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    if not layers:
        raise ValueError(f"{type(base).__name__}: no decoder layers found to shard (no _no_split_modules)")
    return layers


def adapter_modules(layer: nn.Module) -> list[nn.Module]:
    """The LoRA linears (lora_A/lora_B of every adapter) inside one decoder layer."""
    found: list[nn.Module] = []
    for module in layer.modules():
        for attribute in ("lora_A", "lora_B"):
            found += list(getattr(module, attribute, {}).values())
    return found


def shard(model: nn.Module, compute_dtype: torch.dtype, cuda: bool) -> nn.Module:
    """Shard `model` in place over the default process group (see the module docstring); returns it."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy: dict[str, Any] = {}
    if cuda and compute_dtype != torch.float32:
        policy["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        adapters = adapter_modules(layer)
        if adapters:
            fully_shard(adapters, **policy)
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    return model


def local_parameter_bytes(model: nn.Module, trainable: bool) -> int:
    """Bytes of the trainable (True) or frozen (False) parameters this rank holds (a DTensor's local shard, else
    the whole tensor)."""
    total = 0
    for parameter in model.parameters():
        if parameter.requires_grad != trainable:
            continue
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        total += local.numel() * local.element_size()
    return total
