"""Every loaded LoRA adapter applied in one pass over a batch whose rows use different adapters.

peft's per-row `adapter_names` splits every wrapped layer's input by adapter and runs each adapter on its slice:
in every layer, each step, the rows of each adapter found again, then index, A, B, scale and index_add per
adapter, and a walk of every module per forward to pass the names down. On a 16-row CPU batch of SmolLM2-135M
with three adapters that was a third of the engine's time. Here each wrapped linear layer keeps its adapters' A
matrices stacked into one `(d_in, R)` and their B matrices into one `(R, d_out)` (R: the ranks summed), and a
forward hook adds `((x @ A) * m) @ B`, where `m` holds each row's adapter's scaling on that adapter's R columns
and zero elsewhere (a base row: zero everywhere). Two matrix products and a multiply per layer, whatever the mix;
the stacks are rebuilt after a load or unload, the row masks only when the batch's rows change. peft's own LoRA
path stays switched off (its layers run the base alone) while the hooks are on.

Only plain LoRA on linear layers is stacked (vLLM serves no more): `unstackable` names what an adapter has beyond
that (a variant such as DoRA, a LoRA bias, LoRA on an embedding or a convolution), and the engine refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import Linear as LoraLinear


@dataclass
class LayerStack:
    """One wrapped layer's adapters, side by side: `a` is `(d_in, R)`, `b` is `(R, d_out)`, in the base layer's
    dtype; `columns` is each adapter's column range and scaling."""

    a: torch.Tensor
    b: torch.Tensor
    columns: tuple[tuple[str, int, int, float], ...]
    mask: torch.Tensor | None = None
    """each row's scaling per column for the batch being run; None for an all-base batch"""


def lora_layers(model: torch.nn.Module) -> list[LoraLayer]:
    return [module for module in model.modules() if isinstance(module, LoraLayer)]


def unstackable(model: torch.nn.Module, adapter: str) -> str | None:
    """What `adapter` has beyond plain LoRA on linear layers, or None."""
    for name, layer in model.named_modules():
        if not isinstance(layer, LoraLayer) or not any(adapter in getattr(layer, weights)
                                                        for weights in layer.adapter_layer_names):
            continue
        if not isinstance(layer, LoraLinear):
            return f"LoRA on {name}, a {type(layer.get_base_layer()).__name__} layer"
        if adapter in layer.lora_variant:
            return f"a LoRA variant on {name} ({type(layer.lora_variant[adapter]).__name__})"
        if layer.lora_B[adapter].bias is not None:
            return f"a LoRA bias on {name}"
    return None


def stack_layer(layer: LoraLinear, adapters: Sequence[str]) -> LayerStack | None:
    """The layer's adapters among `adapters`, in that order, stacked; None if it has none of them."""
    names = [name for name in adapters if name in layer.lora_A]
    if not names:
        return None
    weight = layer.get_base_layer().weight
    a = torch.cat([layer.lora_A[name].weight for name in names]).t()
    b = torch.cat([layer.lora_B[name].weight for name in names], dim=1).t()
    columns, start = [], 0
    for name in names:
        rank = layer.lora_A[name].weight.shape[0]
        columns.append((name, start, start + rank, float(layer.scaling[name])))
        start += rank
    return LayerStack(a.to(weight.dtype).contiguous(), b.to(weight.dtype).contiguous(), tuple(columns))


def row_mask(columns: tuple[tuple[str, int, int, float], ...], width: int, rows: Sequence[str],
             like: torch.Tensor) -> torch.Tensor:
    """`(rows, 1, width)`: each row's adapter's scaling on its columns, zero elsewhere."""
    mask = torch.zeros((len(rows), 1, width), dtype=like.dtype, device=like.device)
    where = {name: (start, stop, scaling) for name, start, stop, scaling in columns}
    for i, name in enumerate(rows):
        if name in where:
            start, stop, scaling = where[name]
            mask[i, 0, start:stop] = scaling
    return mask


class StackedLora:
    """The hooks on a peft model's LoRA layers and their stacks. `rebuild` after every adapter load or unload;
    `route(names)` before each forward (each row's adapter; any other name, such as peft's `__base__`, runs the
    base)."""

    def __init__(self) -> None:
        self.stacks: dict[LoraLinear, LayerStack] = {}
        self.handles: list[Any] = []
        self.routed: tuple[str, ...] | None = None

    def rebuild(self, model: torch.nn.Module, adapters: Sequence[str]) -> None:
        """Stack `adapters` on every LoRA layer of `model`, hook the layers, and switch peft's own LoRA path off."""
        self.close()
        for layer in lora_layers(model):
            stack = stack_layer(layer, adapters)
            if stack is not None:
                self.stacks[layer] = stack
                self.handles.append(layer.register_forward_hook(self.add_delta))
            layer.enable_adapters(False)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.stacks, self.handles, self.routed = {}, [], None

    def route(self, names: Sequence[str]) -> None:
        key = tuple(names)
        if key == self.routed:
            return
        masks: dict[tuple, torch.Tensor | None] = {}
        for stack in self.stacks.values():
            if stack.columns not in masks:
                mask = row_mask(stack.columns, stack.a.shape[1], key, stack.a)
                masks[stack.columns] = mask if bool(mask.any()) else None
            stack.mask = masks[stack.columns]
        self.routed = key

    def add_delta(self, layer: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        stack = self.stacks[layer]
        if stack.mask is None:
            return None
        x = args[0]
        return output.add_(torch.matmul(torch.matmul(x.to(stack.a.dtype), stack.a) * stack.mask, stack.b)
                           .to(output.dtype))
