"""Hostile and careless input to `ftstack` and the data stages (issue 32): deep JSON nesting, bytes that are not
UTF-8, odd stack names, a dashboard folder that is a file, a malformed Prometheus URL, NaN figures. Everything
through the real console entries as subprocesses; each failure must be one line naming the file or field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_run_guards import ROOT, STACK, finished, ftstack, make_repo

DEEP = "[" * 100_000 + "]" * 100_000


def new_repo(path: Path) -> Path:
    """make_repo's stack folder without its empty `documents`, `planning` and `workloads` packages, so that `ftstack`
    imports this checkout's (an editable install elsewhere would otherwise fill in the missing modules)."""
    path.mkdir(parents=True, exist_ok=True)
    repo = make_repo(path)
    shutil.rmtree(repo / "documents")
    shutil.rmtree(repo / "planning")
    (repo / "workloads" / "__init__.py").unlink()
    return repo


def one_line_error(code: int, err: str) -> str:
    assert code not in (0, None) and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def local_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The local stack's outputs as `ftstack plan --json` prints them."""
    proc = subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", "--stack", "local", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["outputs"]


def report(repo: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None
           ) -> tuple[int, str, str]:
    proc = ftstack(repo, "report", "--stack", "local", "--config-dir", str(ROOT / "stacks"), *args, env=env,
                   stdin=subprocess.PIPE)
    out, err = proc.communicate(stdin, timeout=300)
    return proc.returncode, out, err


# 1. Deep nesting: a clear error, never a RecursionError.

def test_report_refuses_deeply_nested_outputs_from_a_file_and_from_stdin(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "repo")
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    code, _, err = report(repo, "--outputs", str(deep), "--out", str(tmp_path / "page"))
    assert str(deep) in one_line_error(code, err) and "nested" in err, err
    code, _, err = report(repo, "--outputs", "-", "--out", str(tmp_path / "page"), stdin=DEEP)
    assert "standard input" in one_line_error(code, err) and "nested" in err, err


@pytest.mark.parametrize("name,text", [("deep.jsonl", '{"user": "a", "assistant": "b"}\n' + DEEP + "\n"),
                                       ("deep.json", DEEP)])
def test_convert_refuses_deeply_nested_json(tmp_path: Path, name: str, text: str) -> None:
    source = tmp_path / name
    source.write_text(text)
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "workloads.data.convert", "--input", str(source), "--output",
                           str(out), "--max-bad-fraction", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    assert str(source) in proc.stderr and "nested" in proc.stderr, proc.stderr
    assert not out.exists()


# 3. Bytes that are not UTF-8: the file and the byte offset.

def test_a_stack_file_that_is_not_utf8_is_named_with_its_byte_offset(tmp_path: Path) -> None:
    repo = new_repo(tmp_path)
    path = repo / "stacks" / "Pulumi.guard.yaml"
    text = STACK.encode()
    path.write_bytes(text[:20] + b"\xff" + text[20:])
    code, _, err = finished(ftstack(repo, "plan", "--stack", "guard"))
    line = one_line_error(code, err)
    assert "Pulumi.guard.yaml" in line and "byte 20" in line and "UTF-8" in line, err


def test_pipeline_state_and_outputs_that_are_not_utf8_are_named_with_their_byte_offset(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "repo")
    state = repo / ".local" / "pipeline" / "guard.json"
    state.parent.mkdir(parents=True)
    state.write_bytes(b'{"stack": "gu\xe9rd"}')
    code, _, err = finished(ftstack(repo, "status", "--stack", "guard"))
    assert str(state) in one_line_error(code, err) and "byte 13" in err, err

    outputs = tmp_path / "outputs.json"
    outputs.write_bytes(b'{"stack": "\xc3("}')
    code, _, err = report(repo, "--outputs", str(outputs), "--out", str(tmp_path / "page"))
    assert str(outputs) in one_line_error(code, err) and "byte 11" in err, err


# 4. `report --out` at a file or where nothing can be written.

def test_report_out_at_a_file_or_an_unwritable_place_is_one_line(tmp_path: Path, local_outputs: dict) -> None:
    repo = new_repo(tmp_path / "repo")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(local_outputs))
    a_file = tmp_path / "taken"
    a_file.write_text("keep me")
    code, _, err = report(repo, "--outputs", str(outputs), "--out", str(a_file))
    assert str(a_file) in one_line_error(code, err) and "not a folder" in err, err
    assert a_file.read_text() == "keep me"
    unwritable = Path("/proc/self/ftstack-dashboard")
    code, _, err = report(repo, "--outputs", str(outputs), "--out", str(unwritable))
    assert str(unwritable) in one_line_error(code, err), err


# 5. Stack names follow Pulumi's rule at every entry point.

@pytest.mark.parametrize("command", ["run", "status", "plan", "runs", "report"])
def test_a_stack_name_with_a_path_in_it_is_refused_before_any_file_is_touched(tmp_path: Path, command: str) -> None:
    repo = new_repo(tmp_path / "a" / "b" / "repo")
    (repo / "stacks" / "Pulumi.x").mkdir()
    (tmp_path / "a" / "b" / "etc.yaml").write_text(STACK)  # what stacks/Pulumi.x/../../../etc.yaml names
    before = sorted(p for p in tmp_path.rglob("*"))
    extra = ["--out", str(tmp_path / "page")] if command == "report" else []
    code, _, err = finished(ftstack(repo, command, "--stack", "x/../../../etc", *extra))
    line = one_line_error(code, err)
    assert "'x/../../../etc'" in line and "letters, digits" in line, err
    assert sorted(p for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("name", [".", "..", "a/b", "a\\b", "", "a b"])
def test_stack_and_run_id_names_are_checked_by_the_models(name: str) -> None:
    from pydantic import ValidationError

    from documents.run_record import RunIndex
    from infra.config import StackConfig

    with pytest.raises(ValidationError, match="letters, digits"):
        RunIndex(stack="local", run_id=name, uploaded_at="2026-11-25T00:00:00+00:00")
    with pytest.raises(ValidationError, match="letters, digits"):
        RunIndex(stack=name, run_id="r1", uploaded_at="2026-11-25T00:00:00+00:00")
    with pytest.raises(ValidationError, match="letters, digits"):
        StackConfig.model_validate({"stack": name, "target": "local", "pipeline": {"runConfig": "x.json"}})


@pytest.mark.parametrize("command", ["runs", "plan", "report"])
def test_a_stack_name_of_300_characters_is_one_line_naming_pulumis_bound(tmp_path: Path, command: str) -> None:
    """Issue 54 item 4: `OSError [Errno 36] File name too long` before the bound."""
    extra = ["--out", str(tmp_path / "page")] if command == "report" else []
    code, _, err = finished(ftstack(new_repo(tmp_path / "repo"), command, "--stack", "s" * 300, *extra))
    line = one_line_error(code, err)
    assert "(300 characters)" in line and "at most 100 characters" in line, err
    assert "Errno" not in line and "s" * 41 not in line, err


def test_pulumis_stack_name_length_is_the_bound_of_stack_names_and_run_ids() -> None:
    """100 characters pass and 101 do not (pulumi/pulumi sdk/go/common/tokens/stack_name_test.go: "long" is
    strings.Repeat("a", 100), "too-long" 101)."""
    from pydantic import ValidationError

    from documents.run_record import RunIndex

    assert RunIndex(stack="a" * 100, run_id="b" * 100, uploaded_at="2026-11-28T00:00:00+00:00").stack == "a" * 100
    for stack, run_id in (("a" * 101, "r"), ("local", "b" * 101)):
        with pytest.raises(ValidationError, match="at most 100 characters"):
            RunIndex(stack=stack, run_id=run_id, uploaded_at="2026-11-28T00:00:00+00:00")


# 6. A malformed Prometheus URL.

def test_a_malformed_prometheus_url_is_named_not_a_traceback(tmp_path: Path, local_outputs: dict) -> None:
    from documents.run_record import RunIndex, write_run_record

    repo = new_repo(tmp_path / "repo")
    run = repo / ".local" / "artifacts" / "runs" / "local" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(write_run_record(RunIndex(
        stack="local", run_id="r1", uploaded_at="2026-11-25T00:00:00+00:00", started_at="2026-11-25T00:00:00+00:00",
        finished_at="2026-11-25T00:10:00+00:00", job_ids={"train": "7"})))
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(local_outputs))
    code, out, err = report(repo, "--outputs", str(outputs), "--out", str(tmp_path / "page"),
                            env={"FTSTACK_PROMETHEUS_URL": "http://[::1"})
    assert code == 0 and "Traceback" not in err, err
    page = (tmp_path / "page" / "index.html").read_text()
    assert "http://[::1" in page and "invalid" in page.lower(), page[-2000:]


# 9. Log paths with the job id, not Slurm's %j.

def test_status_prints_the_real_log_file_of_each_job(tmp_path: Path, slurm: str) -> None:
    """`ftstack status` asks the local Slurm for its nodes (sinfo): the `slurm` fixture starts it and exports
    SLURM_CONF (without it the test passed only where an earlier test on its worker had)."""
    repo = new_repo(tmp_path)
    state = repo / ".local" / "pipeline" / "guard.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"stack": "guard", "stages": {"prepare": {"stage": "prepare", "outs": {
        "job_id": "4242", "state": "COMPLETED", "output": "/work/results/logs/local-prepare-%j.out"}}}}))
    code, out, err = finished(ftstack(repo, "status", "--stack", "guard", "--json"))
    assert code == 0, err
    assert json.loads(out)["jobs"]["prepare"]["output"] == "/work/results/logs/local-prepare-4242.out"
    code, out, err = finished(ftstack(repo, "status", "--stack", "guard"))
    assert code == 0 and "local-prepare-4242.out" in out and "%j" not in out, out


# 10. NaN and infinity.

def test_nan_in_a_required_output_figure_is_refused_naming_the_field(tmp_path: Path, local_outputs: dict) -> None:
    repo = new_repo(tmp_path / "repo")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({**local_outputs, "cost_monthly_usd_high": float("nan")}))
    assert "NaN" in outputs.read_text()
    code, _, err = report(repo, "--outputs", str(outputs), "--out", str(tmp_path / "page"))
    assert "cost.monthly_usd_high" in one_line_error(code, err) and "finite" in err, err


def test_nan_and_infinity_in_optional_figures_are_shown_as_not_measured(tmp_path: Path, local_outputs: dict) -> None:
    from documents.run_record import RunIndex, write_run_record

    repo = new_repo(tmp_path / "repo")
    run = repo / ".local" / "artifacts" / "runs" / "local" / "r1"
    (run / "train").mkdir(parents=True)
    (run / "train" / "metrics.jsonl").write_text(
        '{"step": 1, "epoch": 0.1, "loss": 2.5}\n{"step": 2, "epoch": 0.2, "loss": NaN, "grad_norm": Infinity}\n'
        '{"step": 3, "epoch": 0.3, "loss": 2.0}\n')
    (run / "run.json").write_text(write_run_record(RunIndex(
        stack="local", run_id="r1", uploaded_at="2026-11-25T00:00:00+00:00", files=["train/metrics.jsonl"])))
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({**local_outputs, "eval_perplexity_base": float("nan"),
                                   "eval_tokens_per_second_finetuned": float("inf")}))
    code, out, err = report(repo, "--outputs", str(outputs), "--out", str(tmp_path / "page"))
    assert code == 0, err
    page = (tmp_path / "page" / "index.html").read_text()
    shown = page.replace(str(tmp_path), "").lower().replace("finance", "")
    assert "nan" not in shown and "inf<" not in shown, page


def test_documents_refuse_or_drop_non_finite_figures() -> None:
    from documents.metrics import MetricsRecord, read_metrics

    records = read_metrics('{"step": 2, "epoch": 0.2, "loss": NaN, "grad_norm": -Infinity}\n', "m.jsonl")
    assert records[0].loss is None and records[0].grad_norm is None
    assert MetricsRecord(step=1, epoch=0.0, loss=float("nan")).line() == '{"version":1,"step":1,"epoch":0.0}\n'
    from documents.evaluator_report import Comparison

    with pytest.raises(ValueError, match="finite"):
        Comparison(perplexity=None, speed=None, time_to_first_token=None, message_length=None, message_tokens=None,
                   rouge_l=float("nan"), bleu=1.0, chrf=1.0)
    assert Comparison(perplexity=None, speed=None, time_to_first_token=None, message_length=None,
                      message_tokens=None, rouge_l=1.0, bleu=1.0, chrf=1.0, exact_match=float("inf")).exact_match is None


# 11. convert names the real cause and the target.

def test_convert_names_a_line_that_is_not_json_rather_than_missing_columns(tmp_path: Path) -> None:
    source = tmp_path / "big.jsonl"
    source.write_text("x" * 5_000_000 + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "workloads.data.convert", "--input", str(source), "--output",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "missing column" not in proc.stderr and "not valid JSON" in proc.stderr and "line 1" in proc.stderr, \
        proc.stderr


def test_convert_into_a_folder_names_the_folder_not_a_temporary_file(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps({"user": "u", "assistant": "a"}) + "\n")
    folder = tmp_path / "out"
    folder.mkdir()
    proc = subprocess.run([sys.executable, "-m", "workloads.data.convert", "--input", str(source), "--output",
                           str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{folder}:" in proc.stderr and ".tmp" not in proc.stderr, proc.stderr
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out", "rows.jsonl"]
