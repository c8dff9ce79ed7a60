"""FSDP2 (`torch.distributed.fsdp.fully_shard`) over the training model, before the Trainer sees it.

Groups, innermost first: each decoder layer's LoRA adapter (trainable, fp32), then the decoder layer itself (the
frozen base, or every weight under a full fine-tune), then the root (embeddings, LM head, final norm). Keeping the
trainable adapter out of the frozen base's group gives each group one dtype and lets the base skip gradient
reduction. On a GPU the mixed precision policy gathers parameters in the compute dtype and reduces gradients in
fp32; a bitsandbytes 4-bit base shards because it is stored in the compute dtype (`bnb_4bit_quant_storage`).

`shard_from_rank0` is the host-memory-safe path of an unquantized base: only rank 0 holds the loaded weights, every
other rank builds the same model on the meta device (no bytes), all shard the empty structure, and rank 0's
tensors are broadcast one at a time into the shards (torch.distributed.checkpoint's `set_model_state_dict` with
`broadcast_from_rank0`, as accelerate's `cpu_ram_efficient_loading` does for FSDP2). A non-zero rank's host memory
thus grows by its shards, not by the model.

HSDP passes a 2-D DeviceMesh (`hsdp_mesh`): every group is sharded within a shard group of ranks and replicated
across the groups (FSDP2 reduce-scatters gradients within a group and all-reduces them across groups).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


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


def hsdp_mesh(replicas: int, shards: int, cuda: bool) -> DeviceMesh:
    """The 2-D mesh of HSDP: `replicas` groups of `shards` consecutive ranks (one node's ranks when the shard group
    is a node), each group sharding the model and the groups replicating one another."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cuda" if cuda else "cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))


def shard(model: nn.Module, compute_dtype: torch.dtype, cuda: bool, offload: bool = False,
          mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard `model` in place over the default process group, or over `mesh` (HSDP's 2-D mesh: sharded along
    "shard", replicated along "replicate"), see the module docstring, with FSDP's CPU offload when `offload`;
    returns it."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    policy: dict[str, Any] = {"offload_policy": CPUOffloadPolicy(pin_memory=cuda)} if offload else {}
    if mesh is not None:
        policy["mesh"] = mesh
    if cuda and compute_dtype != torch.float32:
        policy["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        adapters = adapter_modules(layer)
        if adapters:
            fully_shard(adapters, **policy)
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    return model


def non_persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers a state dict leaves out (rotary frequencies), by qualified name: broadcast separately."""
    found = {}
    for prefix, module in model.named_modules():
        for name in sorted(module._non_persistent_buffers_set):
            if module._buffers.get(name) is not None:
                found[f"{prefix}.{name}" if prefix else name] = module._buffers[name]
    return found


def _tie(model: nn.Module) -> None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "tie_weights"):
        base.tie_weights()


def shard_from_rank0(model: nn.Module, compute_dtype: torch.dtype, cuda: bool, offload: bool = False,
                     mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard `model` (loaded on rank 0, on the meta device on every other rank) and fill the shards from rank 0's
    weights (see the module docstring); returns it. Under HSDP (`mesh`) rank 0 broadcasts to every rank and each
    keeps its slice of its shard group's layout (`set_model_state_dict` slices by the DTensor's mesh and
    placements)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    rank0 = dist.get_rank() == 0
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    buffers = non_persistent_buffers(model)
    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    full = model.state_dict() if rank0 else {}
    if rank0:
        model.to(torch.device("meta"))
        _tie(model)
    shard(model, compute_dtype, cuda, offload, mesh)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                               cpu_offload=offload))
    del full
    _tie(model)  # loading assigns each key its own tensor: a tied LM head is made the embeddings' again
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(trainable[name])  # the assigned parameters are new: the frozen base stays frozen
    for name, held in buffers.items():
        tensor = held.to(device) if rank0 else torch.empty(held.shape, dtype=held.dtype, device=device)
        dist.broadcast(tensor, src=0)
        owner, _, attribute = name.rpartition(".")
        model.get_submodule(owner).register_buffer(attribute, tensor, persistent=False)
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
