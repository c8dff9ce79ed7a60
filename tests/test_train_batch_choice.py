"""`batching: auto`: packed or padded chosen from the data's lengths, recorded with its figures; and the loss is
the same function of the rows whichever is chosen."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from documents.run_config import parse_run_config
from documents.run_manifest import RunManifest
from documents.train_plan import planned_batching
from workloads.train.batch_choice import MICRO_BATCH_OVERHEAD_TOKENS, PACKED_ROW_PENALTY, decide_batching
from workloads.train.batching import IGNORE_INDEX, REAL_TOKENS, PackedCollator, PackedDataset, PaddedCollator
from workloads.train.config import create_training_arguments

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"micro_batch_size": 1, "accumulation": 1, "max_length": 384, "token_budget": 384, "seed": 0}


def test_dense_rows_go_padded_with_the_figures_recorded() -> None:
    """Rows of 380 tokens: one per packed micro-batch plus 4 filler tokens, and one per padded micro-batch with
    no padding at all; padded is cheaper by the filler and the packed-row penalty."""
    decision = decide_batching("auto", [380] * 50, cuda=False, **SETTINGS)
    overhead, penalty = MICRO_BATCH_OVERHEAD_TOKENS, PACKED_ROW_PENALTY["cpu"]
    assert decision.chosen == "grouped"
    assert decision.packed_fill == round(380 / 384, 4)
    assert decision.padded_efficiency == 1.0
    assert decision.packed_cost == round((overhead + 384 * (1 + penalty)) / 380, 4)
    assert decision.padded_cost == round((overhead + 380) / 380, 4)
    assert (decision.rows, decision.token_budget, decision.device) == (50, 384, "cpu")
    assert "packed" in decision.reason and "grouped" in decision.reason


def test_mixed_rows_go_packed() -> None:
    """Three 20-token turns beside each 370-token report: a padded micro-batch of one row pays the overhead per
    short row; nineteen turns fill a packed row. (With 90-token turns the CPU's packed-row penalty makes padding
    the cheaper: the bench's mixed set on CPU.)"""
    lengths = [370 if i % 4 == 0 else 20 for i in range(200)]
    ninety = decide_batching("auto", [370 if i % 4 == 0 else 90 for i in range(200)], cuda=False, **SETTINGS)
    assert ninety.chosen == "grouped" and ninety.packed_cost > ninety.padded_cost
    decision = decide_batching("auto", lengths, cuda=False, **SETTINGS)
    real = sum(lengths)
    assert decision.chosen == "packed"
    assert decision.padded_cost == round((MICRO_BATCH_OVERHEAD_TOKENS * len(lengths) + real) / real, 4)
    assert decision.packed_cost < decision.padded_cost
    assert decision.packed_fill > 0.8


def test_padded_micro_batches_of_several_rows_pay_their_padding() -> None:
    """Two rows per micro-batch of lengths 100 and 300 alternating: the length-grouped sampler pairs like with
    like inside its mega-batches, so padding efficiency lies between the random pairing's and 1."""
    lengths = [100, 300] * 100
    decision = decide_batching("auto", lengths, cuda=True, **{**SETTINGS, "micro_batch_size": 2,
                                                               "token_budget": 768})
    random_pairs = sum(lengths) / (len(lengths) * 300)
    assert random_pairs < decision.padded_efficiency <= 1.0
    assert decision.packed_penalty == PACKED_ROW_PENALTY["cuda"]


def test_the_choice_is_a_function_of_data_and_device() -> None:
    lengths = [random.Random(3).randint(20, 384) for _ in range(300)]
    first = decide_batching("auto", lengths, cuda=False, **SETTINGS)
    assert decide_batching("auto", list(lengths), cuda=False, **SETTINGS) == first
    assert decide_batching("auto", lengths, cuda=True, **SETTINGS).packed_cost < first.packed_cost


def test_configured_batching_is_kept_and_auto_without_data_plans_as_packed() -> None:
    assert decide_batching("grouped", [380] * 5, cuda=False, **SETTINGS).chosen == "grouped"
    assert decide_batching("packed", [380] * 5, cuda=False, **SETTINGS).chosen == "packed"
    assert decide_batching("auto", None, cuda=False, **SETTINGS).chosen == "packed"
    assert planned_batching("auto") == "packed" and planned_batching("grouped") == "grouped"


def test_training_arguments_follow_the_resolved_batching(tmp_path: Path) -> None:
    data = json.loads((ROOT / "workloads" / "configs" / "local.json").read_text())
    data["train"]["micro_batch_size"] = 3
    train = parse_run_config(data, "local.json").train
    assert train.batching == "auto"
    padded = create_training_arguments(train, tmp_path, "fp32", batching="grouped")
    packed = create_training_arguments(train, tmp_path, "fp32", batching="packed")
    assert (padded.per_device_train_batch_size, padded.train_sampling_strategy) == (3, "group_by_length")
    assert (packed.per_device_train_batch_size, packed.train_sampling_strategy) == (1, "random")


def test_shipped_configs_default_to_auto() -> None:
    for path in sorted((ROOT / "workloads" / "configs").glob("*.json")):
        assert json.loads(path.read_text())["train"]["batching"] == "auto", path.name


def test_a_manifest_without_the_batching_field_still_reads() -> None:
    document = {
        "run": "r", "config_sha256": "0" * 64, "config": {}, "precision": "fp32",
        "dataset": {"path": "d", "sha256": "1" * 64},
        "base_model": {"path": "m", "sha256": "2" * 64, "from": "computed"},
        "packages": {}, "world_size": 1, "nodes": 1, "status": "completed",
    }
    assert RunManifest.model_validate(document).batching is None
    decision = decide_batching("auto", [380] * 4, cuda=False, **SETTINGS)
    again = RunManifest.model_validate({**document, "batching": decision.model_dump()})
    assert RunManifest.model_validate_json(again.json_text()).batching == decision


# The same rows through both paths of the trainer ---------------------------------------------------------------

def _tiny_model() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.5)  # large weights: predictions depend strongly on the context
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return model.eval()


def _rows(lengths: list[int], seed: int = 0) -> list[dict[str, list[int]]]:
    """Chat-like rows: a prompt without labels, then assistant tokens with labels."""
    gen = random.Random(seed)
    rows = []
    for length in lengths:
        ids = [gen.randint(3, 299) for _ in range(length)]
        prompt = gen.randint(2, length // 2)
        rows.append({"input_ids": ids, "attention_mask": [1] * length,
                     "labels": [IGNORE_INDEX] * prompt + ids[prompt:], "length": length})
    return rows


class _Tokenizer:
    """What DataCollatorForSeq2Seq asks of a tokenizer to pad."""

    pad_token_id = 0
    padding_side = "right"

    def pad(self, features, padding, max_length, pad_to_multiple_of, return_tensors):  # noqa: ANN001, ANN201
        from transformers import BatchEncoding

        longest = max(len(f["input_ids"]) for f in features) if padding == "longest" else max_length
        out = {k: [f[k] + [0] * (longest - len(f[k])) for f in features] for k in ("input_ids", "attention_mask")}
        return BatchEncoding({k: torch.tensor(v) for k, v in out.items()})


def _token_sum_loss(model: LlamaForCausalLM, batch: dict) -> tuple[float, int]:
    """Summed next-token loss over the batch's assistant labels, and how many tokens it sums."""
    batch = {k: v for k, v in batch.items() if k != REAL_TOKENS}
    labels = batch.pop("labels")
    with torch.no_grad():
        logits = model(**batch).logits
    targets = labels[:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).double(), targets,
                                             ignore_index=IGNORE_INDEX, reduction="sum")
    return loss.item(), int((targets != IGNORE_INDEX).sum())


def test_packed_and_padded_paths_give_the_same_loss_on_the_same_rows() -> None:
    """Six rows of 17-70 tokens: packed (two micro-batches of exactly 192 tokens with filler, as the trainer
    packs them) against padded (micro-batches of 3 rows padded to their longest). Both losses are the mean over
    the same assistant tokens of the same per-token losses; fp32 logits differ only by summation order and
    masked-out terms, so 1e-5 relative is generous (observed about 1e-7) while any leak across rows moves the
    loss by far more (the controls below)."""
    from datasets import Dataset

    model = _tiny_model()
    rows = _rows([17, 70, 33, 52, 24, 61])
    data = PackedDataset(Dataset.from_list(rows), token_budget=192, max_length=192, seed=0)
    packed = [PackedCollator(192, pad_id=0)([data[i]]) for i in range(len(data))]
    assert sorted(len(b["input_ids"][0]) for b in packed) == [192] * len(data)
    padded = [PaddedCollator(_Tokenizer())(rows[k: k + 3]) for k in (0, 3)]

    packed_sum, packed_n = map(sum, zip(*(_token_sum_loss(model, b) for b in packed)))
    padded_sum, padded_n = map(sum, zip(*(_token_sum_loss(model, b) for b in padded)))
    expected_n = sum(sum(1 for label in row["labels"][1:] if label != IGNORE_INDEX) for row in rows)
    assert packed_n == padded_n == expected_n
    assert packed_sum / packed_n == pytest.approx(padded_sum / padded_n, rel=1e-5)

    # Control 1: the same packed rows with positions running on, so tokens attend across row boundaries.
    leaking = [{**b, "position_ids": torch.arange(b["input_ids"].shape[1])[None]} for b in packed]
    leak_sum, _ = map(sum, zip(*(_token_sum_loss(model, b) for b in leaking)))
    assert leak_sum / packed_n != pytest.approx(padded_sum / padded_n, rel=1e-2)
    # Control 2: a row's first token trained as the next token of the previous row.
    unmasked = []
    for b in packed:
        labels = b["labels"].clone()
        starts = (b["position_ids"][0] == 0).nonzero().flatten()[1:]
        labels[0, starts] = b["input_ids"][0, starts]
        unmasked.append({**b, "labels": labels})
    more_sum, more_n = map(sum, zip(*(_token_sum_loss(model, b) for b in unmasked)))
    assert more_n > packed_n
    # six extra targets among 189: the mean moves by about 3e-3, still 100x the tolerance above
    assert more_sum / more_n != pytest.approx(padded_sum / padded_n, rel=1e-3)
