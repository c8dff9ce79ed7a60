"""Every script under bench/ runs at its smallest setting, so a change that breaks one fails here (issue 32).

bench/train.py's own run is in tests/test_bench_train.py. bench/train_gpu.sh needs CUDA; here each of its modes
prints the bench/train.py command it would run, and bench/train.py checks that command's arguments (--dry-run).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from documents.run_config import RunConfig, parse_run_config

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def bench(script: str, *args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_every_bench_script_has_a_test_here_or_beside() -> None:
    tested = {"tokenize.py", "eval_generation.py", "serve.py", "train_gpu.sh", "train.py", "fsdp_load.py",
              "cpu_adamw.py", "process_cpu.py", "train_loss.py"}
    assert {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")} == tested


BURN = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.5:\n    pass"
KILLED = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def test_bench_process_cpu_counts_each_python_process_down_the_tree(tmp_path: Path) -> None:
    """A grandchild that burns 0.5 s of CPU is found under its kind with at least that; one killed by SIGKILL
    writes nothing, so two processes are counted of the three started."""
    outer = f"import subprocess, sys\nfor code in ({BURN!r}, {KILLED!r}):\n    subprocess.run([sys.executable, '-c', code])"
    proc = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), "--", sys.executable, "-c", outer],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["python_processes"] == 2
    burner = next(kind for kind in report["kinds"] if kind["name"] == "-c import time")
    assert burner["processes"] == 1 and burner["cpu_s"] >= 0.5
    assert report["machine_busy_cpu_s"] >= burner["cpu_s"]
    this_test = os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
    assert [test["name"] for test in report["tests"]] == [this_test]  # the three processes were started under it
    assert report["tests"][0]["processes_cpu_s"] >= burner["cpu_s"]


def test_bench_process_cpu_hears_the_venvs_pythons_whatever_their_pythonpath(tmp_path: Path) -> None:
    """A venv's Python whose PYTHONPATH was replaced (as tests/train_fixtures.py does for torchrun) still records,
    through the .pth file; the file is gone after the run."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    hidden = f"import os, subprocess, sys\nsubprocess.run([sys.executable, '-c', {BURN!r}], env={{**os.environ, 'PYTHONPATH': '/nowhere'}})"
    proc = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), "--venv", str(venv), "--",
                           str(venv / "bin" / "python"), "-c", hidden],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    burner = next(kind for kind in report["kinds"] if kind["name"] == "-c import time")
    assert burner["processes"] == 1 and burner["cpu_s"] >= 0.5
    assert report["venv_hook"] and not Path(report["venv_hook"]).exists()
    assert list(venv.glob("lib/python*/site-packages/*.pth")) == []


def test_bench_process_cpu_adds_what_a_test_takes_in_the_pytest_process(tmp_path: Path) -> None:
    (tmp_path / "test_burn.py").write_text(f"def test_burn():\n    exec({BURN!r})\n\ndef test_idle():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    proc = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), "--", sys.executable, "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", "test_burn.py"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    tests = {test["name"]: test for test in report["tests"]}
    assert set(tests) == {"test_burn.py::test_burn", "test_burn.py::test_idle"}
    assert tests["test_burn.py::test_burn"]["in_pytest_cpu_s"] >= 0.5 > tests["test_burn.py::test_idle"]["total_cpu_s"]
    assert report["kinds"][0]["name"] == "-m pytest" and report["kinds"][0]["cpu_s"] >= 0.5


@pytest.mark.skipif(os.geteuid() != 0, reason="process accounting (acct) needs root")
@pytest.mark.skipif(bool(os.environ.get("FT_PROCESS_CPU_ACCT")),
                    reason="the suite itself runs under bench/process_cpu.py --all-processes (one accounting file)")
def test_bench_process_cpu_accounts_every_process_by_command_name(tmp_path: Path) -> None:
    """With --all-processes a non-Python process that exited is found under its command name with the CPU it reports
    itself (the shell's `times`; acct counts in hundredths), and one still alive at the end under the live ones; a
    second run inside it is refused, as it would take the machine's one accounting file over."""
    for name in ("ftburner", "ftlinger"):
        shutil.copy("/bin/sh", tmp_path / name)
    loop = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; times"
    outer = (f"{tmp_path}/ftlinger -c '{loop} > {tmp_path}/linger.times; echo $$ > {tmp_path}/linger.pid; "
             f"exec 1>&- 2>&-; sleep 60' & {tmp_path}/ftburner -c '{loop}' > {tmp_path}/burn.times; "
             f"while [ ! -s {tmp_path}/linger.pid ]; do sleep 0.1; done")
    try:
        proc = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), "--all-processes", "--top", "500", "--",
                               "sh", "-c", outer], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        if (tmp_path / "linger.pid").exists():
            os.kill(int((tmp_path / "linger.pid").read_text()), signal.SIGKILL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    every = json.loads(proc.stdout)["all_processes"]

    def own_cpu(name: str) -> float:  # `times`: the shell's own user and system time on its first line
        return sum(float(part.removesuffix("s").split("m")[1]) + 60 * float(part.split("m")[0])
                   for part in (tmp_path / name).read_text().split()[:2])

    burner = next(row for row in every["exited_by_command"] if row["name"] == "ftburner")
    assert burner["processes"] == 1
    assert burner["cpu_s"] == pytest.approx(own_cpu("burn.times"), abs=0.05) and burner["cpu_s"] > 0.1
    linger = next(row for row in every["running_by_command"] if row["name"] == "ftlinger")
    assert linger["cpu_s"] == pytest.approx(own_cpu("linger.times"), abs=0.05) and linger["cpu_s"] > 0.1
    assert "ftlinger" not in {row["name"] for row in every["exited_by_command"]}
    nested = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), "--all-processes", "--", "true"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "FT_PROCESS_CPU_ACCT": str(tmp_path / "outer.pacct")})
    assert nested.returncode != 0 and "already on for an outer run" in nested.stderr


def test_bench_cpu_adamw_at_its_smallest(tmp_path: Path) -> None:
    report = bench("cpu_adamw.py", "--params", "4096", "--tensors", "2", "--repeats", "1", cwd=tmp_path)
    assert report["params"] == 4096 and report["adamw_step_seconds"] > 0
    assert report["adamw_gb_per_s_at_28_bytes"] == pytest.approx(4096 * 28 / report["adamw_step_seconds"] / 1e9)


def test_bench_fsdp_load_at_its_smallest(tmp_path: Path) -> None:
    report = bench("fsdp_load.py", "--layers", "1", "--hidden", "256", "--intermediate", "512", "--vocab", "1024",
                   "--modes", "rank0", cwd=tmp_path)
    rank0 = report["modes"]["rank0"]
    assert report["ranks"] == 2 and rank0["rank1_growth_bytes"] > 0
    assert sum(rank0["held_bytes_per_rank"]) == report["model_bytes_fp32"]  # two halves of one model


def test_bench_tokenize_at_its_smallest(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = bench("tokenize.py", "--rows", "8", "--num-proc", "1", "--max-length", "128", "--model",
                   str(tiny_model_dir), cwd=tmp_path)
    assert report["rows"] == 8 and report["num_proc"] == 1
    assert report["naive_loop"]["conversations_per_s"] > 0 and report["workloads_tokenize"]["conversations_per_s"] > 0


def test_bench_eval_generation_at_its_smallest(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = bench("eval_generation.py", "--model", str(tiny_model_dir), "--prompts", "2", "--max-new-tokens", "2",
                   "--batch-size", "2", "--timing-runs", "1", "--max-length", "128", "--device", "cpu", cwd=tmp_path)
    assert report["prompts"] == 2 and report["device"] == "cpu" and report["max_new_tokens"] == 2
    assert report["same_replies"].endswith("/2") and report["sequential_s"] > 0


def test_bench_train_loss_at_its_smallest(tiny_prepared: RunConfig, tmp_path: Path) -> None:
    from datasets import load_from_disk

    document = json.loads(tiny_prepared.model_dump_json())
    document["train"] = {"quantization": "none", "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}}
    config = tmp_path / "run.json"
    config.write_text(parse_run_config(document, "tiny_train_loss").model_dump_json())
    report = bench("train_loss.py", "--config", str(config), "--rows", "2", "--repeats", "1", cwd=tmp_path)
    rows = load_from_disk(str(tiny_prepared.locate().train_dataset_dir)).select(range(2))
    assert report["positions"] == sum(len(row["input_ids"]) for row in rows)
    assert report["labelled_positions"] == sum(sum(t != -100 for t in row["labels"][1:]) for row in rows)
    assert set(report["seconds_per_micro_batch"]) >= {"causal_lm_loss", "labelled_positions"}
    assert report["max_loss_difference"] < 1e-4  # the same loss, computed on fewer positions


@pytest.fixture(scope="module")
def tiny_served_run(tiny_prepared: RunConfig, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny prepared run with a one-step LoRA adapter merged, and a CPU serve section; its config file."""
    from eval_fixtures import train_adapter

    work = tmp_path_factory.mktemp("bench-serve")
    document = json.loads(tiny_prepared.model_dump_json())
    document["paths"]["output_dir"] = str(work / "outputs")
    document["serve"] = {"engine": "transformers", "device": "cpu", "dtype": "float32", "cb_num_blocks": 16,
                         "cb_max_batch_tokens": 512}
    run = parse_run_config(document, "tiny_served_run")
    train_adapter(run.base_model_dir, run.train_tokenized_dir, run.adapter_dir, run.merged_dir, steps=1)
    config = work / "run.json"
    config.write_text(run.model_dump_json())
    return config


@pytest.mark.slow
def test_bench_serve_at_its_smallest(tiny_served_run: Path, tmp_path: Path) -> None:
    report = bench("serve.py", "--config", str(tiny_served_run), "--paths", "merged", "--concurrency", "1",
                   "--requests", "1", "--single-requests", "1", "--max-tokens", "2", "--startup-timeout", "300",
                   cwd=tmp_path)
    assert set(report["results"]) == {"base", "finetuned_merged"}
    for side in report["results"].values():
        assert side["1"]["requests"] == 1 and side["1"]["output_tokens"] == 2 and side["1"]["equal_output_tokens"]
    ratios = report["ratios"]["finetuned_merged"]
    assert ratios["finetuned_over_base_c1"] > 0 and ratios["ttft_finetuned_over_base_c1"] > 0
    assert len(report["load_average"]["start"]) == 3


@pytest.mark.parametrize("mode", ["smoke", "14b", "14b-naive", "14b-upcast", "14b-dropout0", "14b-recompute"])
def test_bench_train_gpu_modes_give_bench_train_valid_arguments(mode: str, tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(BENCH / "train_gpu.sh"), mode, str(tmp_path), "TOK", "DATA"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "BENCH_DRY_RUN": "1"})
    assert proc.returncode == 0, proc.stderr
    commands = [shlex.split(line) for line in proc.stdout.splitlines() if "bench/train.py" in line]
    assert len(commands) == 1, proc.stdout
    python, script, *args = commands[0]
    checked = subprocess.run([sys.executable, str(ROOT / script), *args, "--dry-run"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    plan = json.loads(checked.stdout)
    assert plan["arms"] and plan["datasets"] and isinstance(plan["train"], dict)


def test_bench_train_dry_run_refuses_what_a_run_would_refuse(tmp_path: Path) -> None:
    for args, problem in ((["--arms", "auto,nope"], "nope"), (["--train", "{not json"], "--train"),
                          (["--steps", "2", "--warmup", "2"], "--warmup")):
        proc = subprocess.run([sys.executable, str(BENCH / "train.py"), *args, "--dry-run"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and problem in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_bench_serve_adapters_path_at_its_smallest(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The default path: one base with an adapter in one peft engine, against a process per fine-tune (memory)
    and a merged copy in transformers serve (load); its work folder (adapters, merged copies) is gone at the end."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    report = bench("serve.py", "--paths", "adapters", "--base", str(tiny_model_dir), "--adapters", "1",
                   "--clients", "2", "--requests", "2", "--max-tokens", "2", "--startup-timeout", "300", cwd=tmp_path,
                   env={"TMPDIR": str(scratch)})
    assert list(scratch.iterdir()) == []
    adapters = report["adapters"]
    memory = adapters["memory"]["rss_bytes"]
    assert memory["process_per_fine_tune"] > memory["base_and_adapters_one_process"] > 0
    load = adapters["load"]
    assert set(load["base_and_adapters"]["per_name"]) == {"base", "desk-1"}
    sides = (load["base_only"], load["base_and_adapters"], load["merged_transformers_serve"])
    assert all(side["throughput_tokens_per_second"] > 0 and side["output_tokens"] == 2 * 2 for side in sides)
    assert load["equal_output_tokens"] and set(load["tpot_median_s"]) == set(load["ttft_median_s"])
    assert load["issue_40_goal"]["clients"] == 2 and isinstance(load["issue_40_goal"]["met"], bool)


def test_bench_process_cpu_puts_junit_seconds_beside_each_tests_cpu(tmp_path: Path) -> None:
    """The per-test table of a pytest run with --junitxml, made again from the kept log: each test's junit seconds
    (a test sleeping 0.3 s takes at least that) beside its CPU (one burning 0.5 s), a test in a class included."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_burn.py").write_text(
        f"import time\n\ndef test_burn():\n    exec({BURN!r})\n\nclass TestIdle:\n    def test_sleep(self):\n"
        "        time.sleep(0.3)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    ran = subprocess.run([sys.executable, str(BENCH / "process_cpu.py"), "--log", "cpu.jsonl", "--", sys.executable,
                          "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=junit.xml", "tests/test_burn.py"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr[-4000:]
    table = [sys.executable, str(BENCH / "process_cpu.py"), "--from-log", "cpu.jsonl", "--junit", "junit.xml"]
    again = subprocess.run(table, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-4000:]
    tests = {test["name"]: test for test in json.loads(again.stdout)["tests"]}
    assert set(tests) == {"tests/test_burn.py::test_burn", "tests/test_burn.py::TestIdle::test_sleep"}
    assert tests["tests/test_burn.py::test_burn"]["total_cpu_s"] >= 0.5
    assert tests["tests/test_burn.py::TestIdle::test_sleep"]["junit_s"] >= 0.3
    markdown = subprocess.run([*table, "--markdown"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env=env).stdout.splitlines()
    assert markdown[0].startswith("| test | junit s | CPU s") and len(markdown) == 4
    # the seconds pytest wrote for the sleeping test (0.3 and however long the machine took), to one decimal
    written = {case.get("name"): float(case.get("time"))
               for case in ElementTree.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    sleep_s = round(written["test_sleep"], 1)
    assert tests["tests/test_burn.py::TestIdle::test_sleep"]["junit_s"] == sleep_s
    assert any(line.startswith(f"| `tests/test_burn.py::TestIdle::test_sleep` | {sleep_s} |") for line in markdown), \
        markdown
