"""Issue 64 item 9: `ftstack runs --adapters` showed the training output folder (another checkout's
`.local/work/outputs/local/adapter`) instead of the stored copy the server loads. Probe: a run trained in a folder
elsewhere, uploaded to the stack's store, then `ftstack runs --stack h64 --adapters`."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
from adapter_runs import register_run, save_adapter

from documents.run_manifest import model_hash
from documents.run_store import adapter_folder
from infra.commands import runs
from infra.runs.store import LocalStore
from workloads.serve.registry import stored_adapter, stored_runs

STACK = "h64"
STACK_FILE = f"""config:
  soperator-finetune:target: local
  soperator-finetune:clusterName: {STACK}
  soperator-finetune:pipeline:
    runConfig: workloads/configs/local.json
"""
RUN_ID = "20261201T000000Z-64"


def test_the_adapters_listing_shows_the_stored_copy_the_server_loads(tiny_model_dir: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    (repo / "stacks").mkdir(parents=True)
    (repo / "stacks" / f"Pulumi.{STACK}.yaml").write_text(STACK_FILE)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    trained = tmp_path / "other-checkout" / ".local/work/outputs/local/adapter"
    save_adapter(tiny_model_dir, trained, 4, seed=64)
    store = LocalStore(repo / ".local" / "artifacts")
    register_run(store, tmp_path / "other-checkout" / "runs", RUN_ID, tiny_model_dir, trained, 4, stack=STACK)
    monkeypatch.chdir(repo)

    parser = argparse.ArgumentParser(prog="ftstack")
    runs.register(parser.add_subparsers(required=True))
    args = parser.parse_args(["runs", "--stack", STACK, "--adapters"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith(RUN_ID)]

    stored = adapter_folder(store.root, STACK, RUN_ID)
    assert stored == repo / ".local/artifacts/runs" / STACK / RUN_ID / "adapter"  # documents/run_store.py's layout
    assert (stored / "adapter_config.json").is_file()
    assert row.split()[-1] == str(stored) and str(trained) not in out
    served = stored_adapter(stored_runs(store.root, STACK), store.root, STACK, "x", RUN_ID, *_base(tiny_model_dir))
    assert served.adapter_dir == str(stored)


def _base(model_dir: Path) -> tuple[str, str]:
    base = model_hash(model_dir)
    return base["sha256"], base["path"]
