"""The run config: every shipped config validates, derived locations, FT_ROOT, errors naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from documents.run_config import ConfigError, RunConfig, load_run_config, parse_run_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "workloads" / "configs").glob("*.json"))


def _local() -> dict:
    return json.loads((ROOT / "workloads" / "configs" / "local.json").read_text())


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path: Path) -> None:
    config = load_run_config(path)
    assert config.name == path.stem


def test_cloud_configs_write_on_their_stacks_submounts_and_use_a_hub_model() -> None:
    from infra.config import load_stack_config

    for name in ("dev", "demo", "h100"):
        config = load_run_config(ROOT / "workloads" / "configs" / f"{name}.json")
        assert config.model.source.startswith("hub:")
        fs = load_stack_config(name).filesystems
        assert fs is not None
        mounts = [Path(s.mount_path) for s in fs.submounts]
        located = config.locate("/")
        for path in (located.base_model_dir, located.data_dir, located.checkpoints_dir, located.train_run_dir,
                     located.results_dir):
            assert any(m in path.parents for m in mounts), f"{name}: {path} is on no submount of {mounts}"


def test_derived_locations_follow_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FT_ROOT", raising=False)
    data = _local()
    data["paths"] = {"root": str(tmp_path), "output_dir": "out", "checkpoint_dir": "/abs/ckpt"}
    config = parse_run_config(data)
    assert config.base_model_dir == tmp_path / "model" / "base"
    assert config.raw_data_file == tmp_path / "data" / "raw.parquet"
    assert config.conversations_file == tmp_path / "data" / "conversations.jsonl"
    assert config.train_jsonl == tmp_path / "data" / "conversations_train.jsonl"
    assert config.test_jsonl == tmp_path / "data" / "conversations_test.jsonl"
    assert config.train_tokenized_dir == tmp_path / "data" / "tokenized" / "train"
    assert config.test_tokenized_dir == tmp_path / "data" / "tokenized" / "test"
    assert config.checkpoints_dir == Path("/abs/ckpt/local")
    assert config.train_run_dir == tmp_path / "out" / "local"
    assert config.adapter_dir == tmp_path / "out" / "local" / "adapter"
    assert config.merged_dir == tmp_path / "out" / "local" / "merged"
    assert config.results_dir == tmp_path / "results"


def test_ft_root_overrides_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FT_ROOT", str(tmp_path / "elsewhere"))
    config = parse_run_config(_local())
    assert config.base_model_dir == tmp_path / "elsewhere" / "model" / "base"


def test_relative_root_resolves_against_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FT_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert load_run_config(ROOT / "workloads" / "configs" / "local.json").root == tmp_path / ".local" / "work"


@pytest.mark.parametrize(
    ("section", "key", "value", "field"),
    [
        ("data", "split_ratio", 1.5, "data.split_ratio"),
        ("data", "overlong", "wrap", "data.overlong"),
        ("data", "max_length", 0, "data.max_length"),
        ("data", "num_proc", 0, "data.num_proc"),
        ("data", "source", "ftp://x", "data.source"),
        ("model", "source", "s3:bucket/model", "model.source"),
        ("model", "source", "hub:not-a-repo-id", "model.source"),
        ("data", "unknown_knob", 1, "data.unknown_knob"),
    ],
)
def test_wrong_value_names_the_field(section: str, key: str, value: object, field: str) -> None:
    data = _local()
    data[section][key] = value
    with pytest.raises(ConfigError) as error:
        parse_run_config(data, "bad.json")
    assert "bad.json" in str(error.value)
    assert field in str(error.value)


def test_sample_source_needs_rows() -> None:
    data = _local()
    del data["data"]["rows"]
    with pytest.raises(ConfigError, match="rows is required"):
        parse_run_config(data)


def test_unreadable_and_invalid_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing.json"):
        load_run_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json: not valid JSON"):
        load_run_config(broken)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="binary.json"):
        load_run_config(binary)


def test_sections_are_optional_and_model_round_trips() -> None:
    config = parse_run_config(_local())
    again = RunConfig.model_validate(json.loads(config.model_dump_json()))
    assert again == config
