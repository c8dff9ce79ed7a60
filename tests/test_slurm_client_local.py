"""SlurmClient against the real local Slurm (and once through SSH on loopback)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sshd_fixtures import SshServer

from infra.pipeline.slurm import SlurmClient, SlurmJobFailed
from infra.pipeline.ssh import SshTransport

pytestmark = pytest.mark.slurm
WAIT = 180


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + body)
    path.chmod(0o755)
    return str(path)


def test_submit_with_args_env_and_output_then_wait(slurm_client: SlurmClient, tmp_path: Path) -> None:
    script = _script(tmp_path / "job.sh", 'echo "args=$*"; echo "greeting=$GREETING"; pwd; sleep 2\n')
    messages: list[str] = []
    job = slurm_client.submit(
        script,
        ["one", "two words"],
        job_name="ft-ok",
        output=str(tmp_path / "ok-%j.out"),
        workdir=str(tmp_path),
        env={"GREETING": "hello"},
    )
    info = slurm_client.wait(job, timeout=WAIT, progress=messages.append)
    assert (info.state, info.exit_code, info.name) == ("COMPLETED", 0, "ft-ok")
    log = (tmp_path / f"ok-{job}.out").read_text().splitlines()
    assert log == ["args=one two words", "greeting=hello", str(tmp_path)]
    assert any(m.endswith(": RUNNING") for m in messages), messages
    assert messages[-1].startswith(f"job {job} (ft-ok): finished in")
    assert slurm_client.log_tail(job, 2).splitlines() == ["greeting=hello", str(tmp_path)]


def test_failing_job_reports_exit_code_and_log_tail(slurm_client: SlurmClient, tmp_path: Path) -> None:
    script = _script(tmp_path / "bad.sh", 'for i in $(seq 1 50); do echo "line $i"; done\necho "boom: bad row 7" >&2\nexit 3\n')
    job = slurm_client.submit(script, job_name="ft-bad", output=str(tmp_path / "bad-%j.out"), workdir=str(tmp_path))
    with pytest.raises(SlurmJobFailed) as err:
        slurm_client.wait(job, timeout=WAIT, progress=None, log_lines=5)
    assert err.value.info.exit_code == 3 and err.value.info.state == "FAILED"
    text = str(err.value)
    assert f"job {job} (ft-bad) ended FAILED with exit code 3" in text
    assert "boom: bad row 7" in text and "line 47" in text and "line 45" not in text


def test_chain_stops_after_a_failure_and_dependents_never_run(slurm_client: SlurmClient, tmp_path: Path) -> None:
    marker = tmp_path / "second-ran"
    first = slurm_client.submit(_script(tmp_path / "a.sh", "echo preparing; exit 1\n"), job_name="ft-prepare",
                         output=str(tmp_path / "a-%j.out"), workdir=str(tmp_path))
    second = slurm_client.submit(_script(tmp_path / "b.sh", f"touch {marker}\n"), job_name="ft-train", dependencies=[first],
                          output=str(tmp_path / "b-%j.out"), workdir=str(tmp_path))
    third = slurm_client.submit(_script(tmp_path / "c.sh", f"touch {marker}\n"), job_name="ft-eval", dependencies=[second],
                         output=str(tmp_path / "c-%j.out"), workdir=str(tmp_path))
    with pytest.raises(SlurmJobFailed) as err:
        slurm_client.wait_all([first, second, third], timeout=WAIT, progress=None)
    assert err.value.info.job_id == first
    assert "preparing" in str(err.value) and f"job {second} (ft-train)" in str(err.value)
    for job in (second, third):
        with pytest.raises(SlurmJobFailed, match="can never run: DependencyNeverSatisfied"):
            slurm_client.wait(job, timeout=WAIT, progress=None)
        assert slurm_client.state(job).state == "CANCELLED"
    assert not marker.exists()
    assert not (tmp_path / f"b-{second}.out").exists()


def test_cancel_running_job(slurm_client: SlurmClient, tmp_path: Path) -> None:
    job = slurm_client.submit(_script(tmp_path / "long.sh", "echo started; sleep 120; echo never\n"), job_name="ft-long",
                       output=str(tmp_path / "long-%j.out"), workdir=str(tmp_path))
    deadline = time.monotonic() + WAIT
    while slurm_client.state(job).state != "RUNNING":
        assert time.monotonic() < deadline, "job did not start"
        time.sleep(0.5)
    after = slurm_client.cancel(job)
    assert after.state in ("CANCELLED", "COMPLETING")
    with pytest.raises(SlurmJobFailed, match="ended CANCELLED"):
        slurm_client.wait(job, timeout=WAIT, progress=None)
    assert "never" not in (tmp_path / f"long-{job}.out").read_text()
    assert slurm_client.cancel(job).state == "CANCELLED"


def test_wait_reports_training_progress_from_metrics(slurm_client: SlurmClient, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    body = "".join(f'echo "{{\\"step\\": {s}, \\"epoch\\": {s / 10}, \\"loss\\": {3.0 / s:.3f}, \\"job_id\\": \\"$SLURM_JOB_ID\\"}}" >> {metrics}; '
                   'sleep 0.7\n' for s in range(1, 6))
    job = slurm_client.submit(_script(tmp_path / "train.sh", body), job_name="ft-train", output=str(tmp_path / "t-%j.out"))
    messages: list[str] = []
    slurm_client.wait(job, timeout=WAIT, progress=messages.append, metrics_path=str(metrics))
    steps = [m for m in messages if ": step " in m]
    assert steps and steps[-1] == f"job {job} (ft-train): step 5 loss 0.6000 epoch 0.50"
    assert len(steps) >= 2, messages


def test_client_over_ssh_submits_and_waits(sshd: SshServer, slurm: str, tmp_path: Path) -> None:
    script = _script(tmp_path / "remote.sh", "hostname >/dev/null; echo over-ssh\n")
    with SshTransport(sshd.host, port=sshd.port, user=sshd.user, private_key=sshd.private_key,
                      host_key=sshd.host_public_key) as t:
        client = SlurmClient(t, env={"SLURM_CONF": slurm}, poll_s=0.5)
        job = client.submit(script, job_name="ft-ssh", output=str(tmp_path / "r-%j.out"), workdir=str(tmp_path))
        info = client.wait(job, timeout=WAIT, progress=None)
        assert info.succeeded
        assert client.log_tail(info) == "over-ssh"
