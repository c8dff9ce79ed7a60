"""Pure parts of the Slurm client: Slurm's text formats, metrics progress, failure reports."""

from __future__ import annotations

import pytest

from infra.pipeline.slurm import (
    JobInfo,
    describe_failure,
    format_metrics,
    info_from_sacct,
    info_from_scontrol,
    info_from_squeue,
    latest_metrics,
    parse_duration,
    parse_exit_code,
    parse_scontrol_record,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0:00", 0), ("1:05", 65), ("02:03:04", 7384), ("1-00:00:01", 86401), ("Unknown", None), ("", None)],
)
def test_parse_duration(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


def test_parse_exit_code() -> None:
    assert parse_exit_code("3:0") == (3, 0)
    assert parse_exit_code("0:15") == (0, 15)
    assert parse_exit_code("") == (None, None)


def test_scontrol_record_keeps_spaces_and_equals_in_values() -> None:
    line = (
        "JobId=7 JobName=my job JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=2:0 "
        "RunTime=00:01:02 StartTime=2026-01-01T00:00:00 TRES=cpu=1,node=1 StdOut=/tmp/a b/x-7.out Power="
    )
    fields = parse_scontrol_record(line)
    assert fields["JobName"] == "my job"
    assert fields["TRES"] == "cpu=1,node=1"
    assert fields["StdOut"] == "/tmp/a b/x-7.out"
    assert fields["Power"] == ""
    info = info_from_scontrol(fields)
    assert (info.state, info.exit_code, info.elapsed_s, info.dependency) == ("FAILED", 2, 62, None)
    assert info.finished and not info.succeeded


def test_never_started_job_has_no_elapsed_time() -> None:
    fields = parse_scontrol_record(
        "JobId=9 JobName=dep JobState=CANCELLED Reason=DependencyNeverSatisfied Dependency=afterok:8(failed) "
        "ExitCode=0:0 RunTime=20778-20:04:57 StartTime=Unknown"
    )
    info = info_from_scontrol(fields)
    assert info.elapsed_s is None
    text = describe_failure(info, "")
    assert "can never run: DependencyNeverSatisfied" in text and "afterok:8(failed)" in text


def test_squeue_and_sacct_lines() -> None:
    q = info_from_squeue("12|PENDING|DependencyNeverSatisfied|train|0:00|")
    assert q.never_runs and not q.finished and q.nodes is None
    a = info_from_sacct("12|train|CANCELLED by 0|0:15|42|vm|None")
    assert (a.state, a.signal, a.elapsed_s, a.reason) == ("CANCELLED", 15, 42, None)


def test_describe_failure_has_exit_code_and_log_tail() -> None:
    info = JobInfo(job_id="5", name="prepare", state="FAILED", reason="NonZeroExitCode", exit_code=1, source="scontrol")
    text = describe_failure(info, "Traceback\nValueError: bad row 3")
    assert text.startswith("Slurm job 5 (prepare) ended FAILED with exit code 1")
    assert text.endswith("ValueError: bad row 3")
    assert "log is empty or missing" in describe_failure(info, "  ")


def test_latest_metrics_skips_bad_and_partial_lines() -> None:
    lines = ['p": 1, "epoch": 0.2, "loss": 2.5}', '{"step": 1, "epoch": 0.25, "loss": 2.5}', "garbage",
             '{"step": 2, "loss": 2.0, "epoch": 0.5}', '{"step": 2, "epoch": 0.5, "eval_loss": 1.9}', '{"step": 3, "lo']
    record = latest_metrics("\n".join(lines), "m.jsonl")
    assert (record.step, record.loss, record.epoch) == (2, 2.0, 0.5)
    assert format_metrics(record) == "step 2 loss 2.0000 epoch 0.50"
    assert latest_metrics("{}\n[]", "m.jsonl") is None
    two_jobs = '{"step": 5, "epoch": 1, "loss": 1.0, "job_id": "7"}\n{"step": 1, "epoch": 0.1, "loss": 3.0, "job_id": "8"}'
    assert latest_metrics(two_jobs, "m.jsonl", job_id="7").step == 5
