"""Writing a sharded (FSDP2) model's result without one rank holding the model.

- An adapter: only the trainable parameters are gathered, one at a time (adapter-only state, as accelerate saves
  it); the frozen base stays in its shards.
- A full fine-tune: the weights are gathered one tensor at a time (`DTensor.full_tensor`, every rank taking part)
  and rank 0 writes them into safetensors files of at most `shard_bytes` each, with the index transformers reads
  (`model.safetensors.index.json`), so rank 0 holds at most one file's worth plus one tensor.

Both return the most bytes of gathered weights rank 0 held at once (the run manifest's `export_peak_bytes`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

DEFAULT_SHARD_BYTES = 2 * 1024**3
SHARD_BYTES_ENV = "FT_SAVE_SHARD_BYTES"
"""Environment variable that overrides `DEFAULT_SHARD_BYTES` (the tests write small files to see the streaming)."""
INDEX = "model.safetensors.index.json"


def _bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def gather_trainable(model: nn.Module, rank0: bool) -> tuple[dict[str, torch.Tensor], int]:
    """The trainable parameters' full tensors, one at a time, kept on rank 0 (empty elsewhere), and their bytes.
    (torch's `get_model_state_dict(ignore_frozen_params=True)` would still gather a tied LM head: it drops frozen
    parameters by their first name only.)"""
    state = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        full = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
        if rank0:
            state[name] = full.detach().to("cpu")
    return state, _bytes(state)


def _file_name(index: int) -> str:
    return f"model-{index:05d}.safetensors"


def stream_full_model(model: nn.Module, folder: Path | None, shard_bytes: int) -> int:
    """Every weight of `model`, gathered one at a time, written by the rank whose `folder` is set (rank 0; None on
    the others) as safetensors files of at most `shard_bytes` plus the index; returns rank 0's peak bytes held."""
    from safetensors.torch import save_file

    files: list[dict[str, torch.Tensor]] = [{}]
    weight_map: dict[str, str] = {}
    peak = total = 0

    def flush() -> None:
        if folder is not None and files[-1]:
            name = _file_name(len(files))
            save_file(files[-1], str(folder / name), metadata={"format": "pt"})
            weight_map.update({key: name for key in files[-1]})
            files[-1] = {}
            files.append({})

    named = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    for key, value in model.state_dict().items():
        if key not in named:  # a tied weight's second name: saved once, as transformers does
            continue
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        if folder is None:
            del full
            continue
        tensor = full.detach().to("cpu").contiguous()
        size = tensor.numel() * tensor.element_size()
        if files[-1] and _bytes(files[-1]) + size > shard_bytes:
            flush()
        files[-1][key] = tensor
        total += size
        peak = max(peak, _bytes(files[-1]))
    flush()
    if folder is not None:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
    return peak
