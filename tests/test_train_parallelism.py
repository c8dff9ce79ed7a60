"""DDP or FSDP from the memory estimate (planning/parallelism.py), the methods' config, and the estimate
for full fine-tuning and sharding. Expected figures are computed here from the published shapes."""

from __future__ import annotations

import pytest

from documents.run_config import ConfigError, parse_run_config
from planning.memory import GIB, MemoryInputs, estimate
from planning.model_shapes import KNOWN, ModelShape
from planning.parallelism import decide_parallelism

# meta-llama/Llama-3.1-70B config.json
LLAMA70 = ModelShape(hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256,
                     tied_embeddings=False)
QWEN8 = KNOWN["Qwen/Qwen3-8B"]
# per layer: q, o 8192^2; k, v 8192 x 1024; gate, up, down 8192 x 28672
LLAMA70_LINEAR = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
LLAMA70_OTHER = 2 * 128256 * 8192 + 80 * 2 * 8192 + 8192  # embeddings + LM head, two norms per layer, final norm
LLAMA70_PARAMS = LLAMA70_LINEAR + LLAMA70_OTHER
L40S, H100 = 48, 80


def _run(**train: object):
    return parse_run_config({"name": "p", "model": {"source": "dir:/m"},
                             "data": {"source": "sample", "rows": 10, "max_length": 2048},
                             "train": {"micro_batch_size": 1, "gradient_checkpointing": True, **train}}, "p.json")


def test_the_70b_shape_is_what_its_card_says():
    assert LLAMA70.params == LLAMA70_PARAMS
    assert LLAMA70_PARAMS / 1e9 == pytest.approx(70.55, abs=0.01)
    assert LLAMA70_PARAMS * 2 / 1e9 == pytest.approx(141.1, abs=0.1)  # bf16


def test_a_70b_lora_does_not_fit_one_l40s_under_ddp_and_names_the_ranks_it_needs():
    plan = decide_parallelism(_run(method="lora", parallelism="ddp"), LLAMA70, L40S, 8)
    assert (plan.strategy, plan.fits, plan.shards) == ("ddp", False, 1)
    assert plan.per_rank_bytes["base_weights"] == LLAMA70_PARAMS * 2
    assert plan.per_rank_bytes["total"] > 0.9 * L40S * GIB
    assert "does not fit" in plan.reason and "90% of 48 GiB" in plan.reason
    # the bf16 base alone, 141.1e9 B = 131.4 GiB, over 43.2 GiB needs at least 4 shards
    assert plan.min_fsdp_ranks is not None and plan.min_fsdp_ranks >= 4
    assert f"FSDP over {plan.min_fsdp_ranks} or more ranks fits" in plan.reason


@pytest.mark.parametrize("ranks", [2, 8, 16])
def test_auto_shards_a_70b_lora_over_all_ranks(ranks: int):
    plan = decide_parallelism(_run(method="lora"), LLAMA70, L40S, ranks)
    assert (plan.configured, plan.strategy, plan.shards, plan.world_size) == ("auto", "fsdp", ranks, ranks)
    parts = plan.per_rank_bytes
    assert parts["base_weights"] == LLAMA70_PARAMS * 2 // ranks
    lora = 80 * 16 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 2 * (8192 + 28672) + (28672 + 8192))  # r=16, 7 linears
    assert parts["trainable_weights"] == lora * 4 // ranks  # fp32 adapter
    assert parts["gradients"] == lora * 4 // ranks
    assert parts["optimizer_states"] == lora * 8 // ranks  # two fp32 Adam states
    # gathered in use: embeddings, LM head and norms plus two decoder layers' linears, bf16
    assert parts["gathered_weights"] == LLAMA70_OTHER * 2 + 2 * LLAMA70_LINEAR // 80 * 2
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    assert plan.fits == (parts["total"] <= 0.9 * L40S * GIB)
    assert plan.fits == (ranks >= plan.min_fsdp_ranks)
    assert "auto: one whole replica needs" in plan.reason


def test_activations_are_not_divided_by_the_ranks():
    two = decide_parallelism(_run(method="lora"), LLAMA70, L40S, 2).per_rank_bytes
    eight = decide_parallelism(_run(method="lora"), LLAMA70, L40S, 8).per_rank_bytes
    assert two["activations"] == eight["activations"] > 0


def test_a_70b_qlora_base_shards_too():
    nf4 = LLAMA70_LINEAR * (0.5 + 1 / 64 + 4 / (64 * 256)) + LLAMA70_OTHER * 2  # double-quantized NF4 + bf16 rest
    assert nf4 / 1e9 == pytest.approx(39.5, abs=0.1)  # the seed's "35-40 GB in NF4"
    ddp = decide_parallelism(_run(method="qlora", parallelism="ddp"), LLAMA70, L40S, 2)
    fsdp = decide_parallelism(_run(method="qlora", parallelism="fsdp"), LLAMA70, L40S, 2)
    assert ddp.per_rank_bytes["base_weights"] == int(nf4)
    assert fsdp.per_rank_bytes["base_weights"] == int(nf4 / 2)
    assert not ddp.fits and fsdp.fits


def test_a_small_replica_stays_ddp_under_auto():
    plan = decide_parallelism(_run(method="qlora"), QWEN8, L40S, 8)
    assert (plan.strategy, plan.fits, plan.shards) == ("ddp", True, 1)
    assert plan.replica_bytes == plan.per_rank_bytes["total"]


def test_full_fine_tuning_of_an_8b_needs_fsdp_and_divides_masters_gradients_and_adam_states():
    params = QWEN8.params
    ddp = decide_parallelism(_run(method="full", parallelism="ddp"), QWEN8, H100, 16)
    assert ddp.per_rank_bytes["trainable_weights"] == params * 4  # fp32 masters
    assert ddp.per_rank_bytes["base_weights"] == 0
    assert ddp.per_rank_bytes["gradients"] == params * 4 and ddp.per_rank_bytes["optimizer_states"] == params * 8
    assert ddp.per_rank_bytes["gathered_weights"] == params * 2  # autocast's bf16 copies
    assert not ddp.fits  # 16 B/param: 131 GB
    plan = decide_parallelism(_run(method="full"), QWEN8, H100, 16)
    assert (plan.strategy, plan.fits) == ("fsdp", True)
    assert plan.per_rank_bytes["trainable_weights"] == params * 4 // 16
    assert plan.per_rank_bytes["gradients"] == params * 4 // 16
    assert plan.per_rank_bytes["optimizer_states"] == params * 8 // 16


def test_one_rank_cannot_shard_so_auto_stays_ddp_and_says_what_would_fit():
    plan = decide_parallelism(_run(method="lora"), LLAMA70, H100, 1)
    assert (plan.strategy, plan.fits) == ("ddp", False)
    assert f"FSDP needs at least {plan.min_fsdp_ranks} ranks" in plan.reason


def test_fsdp_on_one_rank_keeps_the_replica():
    plan = decide_parallelism(_run(method="lora", parallelism="fsdp"), QWEN8, H100, 1)
    assert (plan.configured, plan.strategy, plan.shards) == ("fsdp", "ddp", 1)
    assert "one rank, nothing to shard" in plan.reason
    assert plan.per_rank_bytes["base_weights"] == QWEN8.params * 2


def test_without_gpu_memory_auto_is_ddp_and_fsdp_when_configured():
    auto = decide_parallelism(_run(method="lora"), LLAMA70, None, 2)
    fsdp = decide_parallelism(_run(method="lora", parallelism="fsdp"), LLAMA70, None, 2)
    assert (auto.strategy, auto.fits, fsdp.strategy, fsdp.shards) == ("ddp", True, "fsdp", 2)
    assert "no GPU memory known" in auto.reason
    unknown = decide_parallelism(_run(method="lora", parallelism="fsdp"), None, L40S, 2)
    assert (unknown.strategy, unknown.per_rank_bytes) == ("fsdp", {})


def test_sharded_estimate_divides_by_the_ranks():
    one = estimate(LLAMA70, MemoryInputs(method="lora", max_length=1024))
    four = estimate(LLAMA70, MemoryInputs(method="lora", max_length=1024, shards=4))
    assert four.weights == LLAMA70_PARAMS * 2 // 4 == one.weights // 4
    assert four.activations == one.activations and four.logits == one.logits


@pytest.mark.parametrize(("train", "method", "quantization"), [
    ({"quantization": "4bit"}, "qlora", "4bit"),
    ({"quantization": "8bit"}, "qlora", "8bit"),
    ({"quantization": "none"}, "lora", "none"),
    ({}, "qlora", "4bit"),
    ({"method": "full"}, "full", "none"),
    ({"method": "lora"}, "lora", "none"),
    ({"method": "qlora", "quantization": "8bit"}, "qlora", "8bit"),
])
def test_quantization_follows_from_the_method_and_older_configs_keep_their_meaning(train, method, quantization):
    run = _run(**train)
    assert (run.train.method, run.train.quantization, run.train.parallelism) == (method, quantization, "auto")


@pytest.mark.parametrize(("train", "words"), [
    ({"method": "full", "quantization": "4bit"}, "method full trains an unquantized base, but quantization is 4bit"),
    ({"method": "lora", "quantization": "8bit"}, "method lora trains an unquantized base"),
    ({"method": "qlora", "quantization": "none"}, "method qlora trains on a 4-bit or 8-bit base"),
    ({"parallelism": "zero3"}, "train.parallelism"),
    ({"parallelism": "hsdp", "hsdp_shard_size": 0}, "train.hsdp_shard_size"),
    ({"parallelism": "fsdp", "hsdp_shard_size": 2}, "train.hsdp_shard_size applies to parallelism hsdp"),
])
def test_contradictions_are_refused_naming_the_fields(train, words):
    with pytest.raises(ConfigError) as error:
        _run(**train)
    assert "p.json" in str(error.value) and words in str(error.value)


LLAMA70_LORA = 80 * 16 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 2 * (8192 + 28672) + (28672 + 8192))  # r=16


def test_hsdp_holds_a_shard_group_s_share_per_rank_and_replicates_across_groups():
    """16 ranks (2 H100 nodes of 8) as HSDP: each rank holds 1/8 of the bf16 base and of the fp32 adapter, its
    gradients and Adam states (FSDP over its node's 8), twice FSDP-over-16's share; 2 replicas."""
    run = _run(method="lora", parallelism="hsdp")
    plan = decide_parallelism(run, LLAMA70, H100, 16, ranks_per_node=8)
    assert (plan.configured, plan.strategy, plan.shards, plan.replicas) == ("hsdp", "hsdp", 8, 2)
    parts = plan.per_rank_bytes
    assert parts["base_weights"] == LLAMA70_PARAMS * 2 // 8
    assert parts["trainable_weights"] == parts["gradients"] == LLAMA70_LORA * 4 // 8
    assert parts["optimizer_states"] == LLAMA70_LORA * 8 // 8
    fsdp = decide_parallelism(_run(method="lora", parallelism="fsdp"), LLAMA70, H100, 16)
    assert (fsdp.shards, fsdp.replicas) == (16, 1)
    assert fsdp.per_rank_bytes["base_weights"] == LLAMA70_PARAMS * 2 // 16
    # 141.1 GB / 8 = 17.6 GB of base per rank plus what is gathered and the activations: under 90% of 80 GiB
    assert plan.fits and parts["total"] <= 0.9 * H100 * GIB and "2 replica(s) of 8 shard(s)" in plan.reason


def test_hsdp_shard_size_is_configurable_and_must_divide_the_world():
    plan = decide_parallelism(_run(method="lora", parallelism="hsdp", hsdp_shard_size=4), LLAMA70, None, 16,
                              ranks_per_node=8)
    assert (plan.strategy, plan.shards, plan.replicas) == ("hsdp", 4, 4)
    assert plan.per_rank_bytes["base_weights"] == LLAMA70_PARAMS * 2 // 4
    with pytest.raises(ValueError, match="train.hsdp_shard_size 3 does not divide the world size of 16 ranks"):
        decide_parallelism(_run(method="lora", parallelism="hsdp", hsdp_shard_size=3), LLAMA70, None, 16)
    # one node's ranks as the group: one replica is FSDP, groups of one rank are DDP
    one = decide_parallelism(_run(method="lora", parallelism="hsdp"), LLAMA70, None, 8, ranks_per_node=8)
    alone = decide_parallelism(_run(method="lora", parallelism="hsdp"), LLAMA70, None, 4, ranks_per_node=1)
    assert (one.strategy, one.shards, one.replicas, alone.strategy, alone.shards, alone.replicas) == (
        "fsdp", 8, 1, "ddp", 1, 4)


def test_hsdp_placement_counts_host_memory_as_fsdp_and_takes_whole_shard_groups():
    from planning.placement import Hardware, decide_placement

    node = Hardware(gpu_memory_gib=H100, gpus_per_node=8, host_memory_gib=1600)
    hsdp = decide_placement(_run(method="lora", parallelism="hsdp", hsdp_shard_size=16), LLAMA70, node)
    fsdp = decide_placement(_run(method="lora", parallelism="fsdp"), LLAMA70, node, 2)
    assert hsdp is not None and (hsdp.nodes, hsdp.plan.strategy, hsdp.plan.shards) == (2, "fsdp", 16)
    # rank 0's node reads the whole bf16 base, its 7 other ranks one largest tensor (the 128256 x 8192 embeddings)
    in_flight = 128256 * 8192 * 2
    assert hsdp.host_bytes_per_node == fsdp.host_bytes_per_node == LLAMA70_PARAMS * 2 + 7 * in_flight
    four = decide_placement(_run(method="lora", parallelism="hsdp"), LLAMA70, node, 4)
    assert (four.plan.strategy, four.plan.shards, four.plan.replicas) == ("hsdp", 8, 4)
    assert four.host_bytes_per_node == hsdp.host_bytes_per_node
