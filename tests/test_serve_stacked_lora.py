"""The CPU engine's stacked adapters (workloads/serve/engine/stacked_lora.py, issue 40 item 4): a batch whose rows use
different adapters, of different ranks, scalings and target layers, gives each row what peft gives that row alone
with only its adapter loaded (or none, for a base row); loads and unloads restack; an adapter beyond plain LoRA
(DoRA) is refused at load."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from adapter_runs import save_adapter

from workloads.serve.adapter_files import read_adapter
from workloads.serve.engine.batching import left_padded
from workloads.serve.engine.server import BASE_ROW, AdapterModel

ADAPTERS = {  # name: (rank, alpha, target modules, DoRA)
    "narrow": (4, 8, ("q_proj", "v_proj"), False),
    "wide": (12, 6, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), False),
    "mlp": (8, 32, ("up_proj", "down_proj"), False),
}
PROMPTS = ["What is a bond?", "Hi", "Summarise the quarter in one line.", "Name a currency.", "Why do rates rise?"]


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stacked-adapters")
    specs = {**ADAPTERS, "dora": (6, 12, ("q_proj", "v_proj"), True),
             "embed": (4, 8, ("q_proj", "embed_tokens"), False)}
    return {name: save_adapter(tiny_model_dir, root / name, rank, 10 + i, alpha, targets, dora)
            for i, (name, (rank, alpha, targets, dora)) in enumerate(specs.items())}


@functools.cache
def reference_model(base: Path, adapter: Path | None) -> torch.nn.Module:
    """The base alone, or through peft with only `adapter` loaded."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    return model if adapter is None else PeftModel.from_pretrained(model, adapter).eval()


def reference_logits(base: Path, adapters: dict[str, Path], prompt: list[int], adapter: str) -> torch.Tensor:
    """The next-token logits of one prompt alone, through peft with only that adapter loaded (or none)."""
    model = reference_model(base, None if adapter == BASE_ROW else adapters[adapter])
    with torch.inference_mode():
        return model(input_ids=torch.tensor([prompt])).logits[0, -1]


def batch_logits(engine: AdapterModel, prompts: list[list[int]], names: list[str]) -> torch.Tensor:
    """One left-padded forward of every prompt, each row through its adapter, as the running batch makes it."""
    ids, mask, positions = left_padded(prompts, engine.pad)
    with torch.inference_mode():
        return engine.forward(ids, mask, positions, None, names)[0]


def assert_rows_as_alone(engine: AdapterModel, base: Path, adapters: dict[str, Path], names: list[str]) -> None:
    prompts = [engine.prompt_ids([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]) for i in range(len(names))]
    mixed = batch_logits(engine, prompts, names)
    for row, (prompt, name) in enumerate(zip(prompts, names)):
        alone = reference_logits(base, adapters, prompt, name)
        assert torch.allclose(mixed[row], alone, atol=2e-4, rtol=1e-4), (row, name, (mixed[row] - alone).abs().max())


def test_each_row_of_a_mixed_batch_gets_what_its_adapter_gives_alone(tiny_model_dir: Path,
                                                                     adapter_dirs: dict[str, Path]) -> None:
    adapters = {name: adapter_dirs[name] for name in ADAPTERS}
    engine = AdapterModel(tiny_model_dir, adapters, "float32", "cpu", 8)
    assert engine.stacked.stacks, "plain LoRA adapters are stacked"
    # the adapters differ from each other and from the base on these prompts, else the check below proves nothing
    prompt = engine.prompt_ids([{"role": "user", "content": PROMPTS[0]}])
    alone = {name: reference_logits(tiny_model_dir, adapters, prompt, name) for name in [BASE_ROW, *ADAPTERS]}
    assert min((a - b).abs().max() for i, a in enumerate(alone.values()) for b in list(alone.values())[i + 1:]) > 0.05
    assert_rows_as_alone(engine, tiny_model_dir, adapters,
                         ["narrow", BASE_ROW, "wide", "mlp", "narrow", "wide", BASE_ROW])
    assert_rows_as_alone(engine, tiny_model_dir, adapters, ["mlp", "mlp", "mlp"])
    assert_rows_as_alone(engine, tiny_model_dir, adapters, [BASE_ROW, BASE_ROW])


def test_unloads_and_loads_restack_the_adapters(tiny_model_dir: Path, adapter_dirs: dict[str, Path]) -> None:
    adapters = {name: adapter_dirs[name] for name in ADAPTERS}
    engine = AdapterModel(tiny_model_dir, {"narrow": adapters["narrow"], "wide": adapters["wide"]}, "float32", "cpu", 8)
    engine.unload("wide")
    assert_rows_as_alone(engine, tiny_model_dir, adapters, ["narrow", BASE_ROW, "narrow"])
    engine.load("mlp", read_adapter(adapters["mlp"]))
    engine.load("wide", read_adapter(adapters["wide"]))
    assert_rows_as_alone(engine, tiny_model_dir, adapters, ["wide", "mlp", BASE_ROW, "narrow"])
    engine.unload("narrow")
    engine.unload("mlp")
    engine.unload("wide")
    assert not engine.stacked.stacks
    assert_rows_as_alone(engine, tiny_model_dir, adapters, [BASE_ROW, BASE_ROW])
    engine.load("wide", read_adapter(adapters["wide"]))
    assert_rows_as_alone(engine, tiny_model_dir, adapters, [BASE_ROW, "wide"])


def test_an_adapter_beyond_plain_lora_is_refused_and_the_others_still_serve(tiny_model_dir: Path,
                                                                            adapter_dirs: dict[str, Path]) -> None:
    """DoRA is what peft's per-row path refuses too ("Cannot pass `adapter_names` when DoRA is enabled"), and vLLM
    serves plain LoRA only: the load fails with the folder and the reason, before the adapter is routed; so does
    LoRA on the embedding."""
    adapters = {name: adapter_dirs[name] for name in ("narrow", "dora")}
    engine = AdapterModel(tiny_model_dir, {"narrow": adapters["narrow"]}, "float32", "cpu", 8)
    with pytest.raises(ValueError, match=r"dora: a LoRA variant on .*q_proj .*plain LoRA on linear layers only"):
        engine.load("dora", read_adapter(adapters["dora"]))
    assert engine.adapters == {"narrow"}
    assert_rows_as_alone(engine, tiny_model_dir, adapters, ["narrow", BASE_ROW, "narrow"])
    with pytest.raises(ValueError, match="a LoRA variant"):
        AdapterModel(tiny_model_dir, {"dora": adapters["dora"]}, "float32", "cpu", 8)
    with pytest.raises(ValueError, match=r"embed: LoRA on .*embed_tokens, a Embedding layer"):
        engine.load("embed", read_adapter(adapter_dirs["embed"]))
    assert_rows_as_alone(engine, tiny_model_dir, adapters, ["narrow", BASE_ROW])
