"""The FSDP2 groups workloads.train.sharding makes, on one gloo rank in this process: each decoder layer's LoRA
linears in a group of their own, the layer's frozen base in another, the root last."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FSDPModule
from transformers import LlamaConfig, LlamaForCausalLM

from serve_process import free_port
from workloads.train import sharding


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def group_of(module: torch.nn.Module) -> list[tuple[str, bool]]:
    """(owning module's class, requires_grad) of every parameter in the FSDP group `module` belongs to."""
    group = module._get_fsdp_state()._fsdp_param_group
    return [(type(p._module_info.module).__name__, p.sharded_param.requires_grad) for p in group.fsdp_params]


def test_adapter_and_frozen_base_shard_in_separate_groups(one_rank: None) -> None:
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    sharding.shard(model, torch.float32, cuda=False)
    layers = sharding.decoder_layers(model)
    assert len(layers) == 2 and isinstance(model, FSDPModule)
    for layer in layers:
        adapters = sharding.adapter_modules(layer)
        assert len(adapters) == 4 and all(isinstance(a, FSDPModule) for a in adapters)  # lora_A, lora_B of q and v
        assert group_of(adapters[0]) == [("FSDPLinear", True)] * 4
        base = group_of(layer)
        assert len(base) == 9 and not any(trainable for _, trainable in base)  # 7 linears, 2 norms, all frozen
    assert all(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())
