"""eval.sbatch and serve.sbatch as real jobs on the local Slurm, on the trained SmolLM2 run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from eval_fixtures import ROOT

from documents.evaluator_report import EvaluatorReport
from documents.run_config import RunConfig
from serve_process import ENGINE_PORTS, free_port

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOBS = ROOT / "workloads" / "jobs"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _submit(script: str, config: Path, work: Path, env_extra: dict[str, str] | None = None) -> tuple[str, Path, Path]:
    env = {**os.environ, "FT_PYTHON": sys.executable, "FT_CODE_DIR": str(ROOT), **(env_extra or {})}
    env.pop("FT_ROOT", None)
    done = subprocess.run(["sbatch", "--parsable", f"--output={work}/%x-%j.out", f"--error={work}/%x-%j.err",
                           "--cpus-per-task=1", str(JOBS / script), str(config)],
                          cwd=work, env=env, capture_output=True, text=True, check=True)
    job = done.stdout.strip().split(";")[0]
    name = script.removesuffix(".sbatch")
    return job, work / f"ft-{name}-{job}.out", work / f"ft-{name}-{job}.err"


def _state(job: str) -> str:
    record = subprocess.run(["scontrol", "show", "job", job, "-o"], capture_output=True, text=True).stdout
    return next((f.split("=", 1)[1] for f in record.split() if f.startswith("JobState=")), "")


def _wait(job: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (state := _state(job)) in ENDED:
            return state
        time.sleep(2)
    subprocess.run(["scancel", job])
    pytest.fail(f"job {job} still {_state(job)} after {timeout}s")


def test_eval_job_writes_the_report_named_after_the_job(slurm, trained_run: RunConfig, tmp_path: Path) -> None:
    config = tmp_path / "run.json"
    config.write_text(trained_run.model_dump_json())
    job, out, err = _submit("eval.sbatch", config, tmp_path)
    state = _wait(job, 900)
    assert state == "COMPLETED", err.read_text()[-3000:]
    document = json.loads(out.read_text())
    assert EvaluatorReport.model_validate(document).job_id == job
    assert json.loads((trained_run.results_dir / f"evaluator_{job}.json").read_text()) == document
    assert (trained_run.results_dir / f"evaluator_{job}.png").is_file()


def test_serve_job_prints_how_to_reach_it_and_answers(slurm, trained_run: RunConfig, tmp_path: Path) -> None:
    data = json.loads(trained_run.model_dump_json())
    port = free_port()
    data["serve"].update(port=port, backend_port=free_port(ENGINE_PORTS), serve_base=False)
    config = tmp_path / "run.json"
    config.write_text(json.dumps(data))
    job, out, err = _submit("serve.sbatch", config, tmp_path)
    try:
        deadline = time.monotonic() + 600
        while not re.search(r"(?m)^gateway on ", out.read_text() if out.exists() else ""):
            assert _state(job) not in ENDED, (err.read_text() if err.exists() else "")[-3000:]
            assert time.monotonic() < deadline, "serve job did not come up in 600s"
            time.sleep(2)
        text = out.read_text()
        assert f"ssh -N -L {port}:127.0.0.1:{port}" in text
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["models"] == {"finetuned": "ok"}
        body = {"model": "finetuned", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=300)
        assert reply.status_code == 200 and reply.json()["model"] == "finetuned"
    finally:
        subprocess.run(["scancel", job], check=False)
    assert _wait(job, 120) in ENDED


def test_serve_job_refuses_public_host_without_key(slurm, trained_run: RunConfig, tmp_path: Path) -> None:
    data = json.loads(trained_run.model_dump_json())
    data["serve"].update(host="0.0.0.0", port=free_port())
    config = tmp_path / "run.json"
    config.write_text(json.dumps(data))
    job, _, err = _submit("serve.sbatch", config, tmp_path, env_extra={"FT_API_KEY": ""})
    assert _wait(job, 300) == "FAILED"
    assert "no API key" in err.read_text()
