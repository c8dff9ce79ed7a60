"""What ftstack tells a user who typed something slightly off: the Ctrl-C hint of `ftstack run --wait` with the
flags the run was given, a malformed FTSTACK_PROMETHEUS_URL said once (issue 42, item 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.commands.cli import build_parser
from infra.commands.run import interrupted_text
from infra.monitoring import jobs
from infra.monitoring.live import live_line


def test_the_interrupt_hint_repeats_the_flags_that_reach_the_stack(tmp_path: Path) -> None:
    args = build_parser().parse_args(["run", "--stack", "guard", "--config-dir", "my stacks", "--wait", "--serve",
                                      "--cost-stack", "demo", "--known-hosts", "/tmp/kh"])
    text = interrupted_text(tmp_path, args)
    assert "ftstack status --stack guard --config-dir 'my stacks' --known-hosts /tmp/kh\n" in text, text
    assert ("ftstack run --stack guard --config-dir 'my stacks' --known-hosts /tmp/kh --serve --cost-stack demo "
            "--wait   (resubmits") in text, text
    plain = interrupted_text(tmp_path, build_parser().parse_args(["run", "--stack", "guard", "--wait"]))
    assert "ftstack status --stack guard\n" in plain and "ftstack run --stack guard --wait   (" in plain, plain


@pytest.mark.parametrize("url, why", [
    ("http://[::1", "not a URL (Invalid port"),
    ("localhost:9090", "does not start with http:// or https:// (scheme 'localhost')"),
    ("http://", "it names no host"),
    ("", "it is empty"),
])
def test_a_malformed_prometheus_url_is_ignored_and_said_once(url: str, why: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(jobs.URL_ENV, url)
    monkeypatch.setattr(jobs, "_said", set())
    assert jobs.prometheus_url("cluster", tmp_path) is None
    assert "ignored" in live_line("cluster", tmp_path, "12") and why in live_line("cluster", tmp_path, "12")
    (tmp_path / jobs.LOCAL_URL_FILE).parent.mkdir(parents=True)
    (tmp_path / jobs.LOCAL_URL_FILE).write_text("http://127.0.0.1:19090\n")
    assert jobs.prometheus_url("local", tmp_path) == "http://127.0.0.1:19090"
    err = capsys.readouterr().err
    assert err.startswith(f"ftstack: {jobs.URL_ENV}={url!r} is ignored: ") and why in err, err
    assert err.count("\n") == 1, err


def test_a_well_formed_prometheus_url_is_used_silently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(jobs.URL_ENV, "http://10.213.0.2:9090")
    assert jobs.prometheus_url("cluster", tmp_path) == "http://10.213.0.2:9090"
    assert capsys.readouterr().err == ""
