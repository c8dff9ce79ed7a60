"""Where a command's CPU goes, per Python process (issue 42, item 13): runs the command with every Python process
it starts, however far down (pytest workers, Slurm jobs, torchrun ranks, servers), recording its own CPU seconds at
exit, and prints JSON: the machine's busy CPU over the run, the part those processes account for, the kinds of
process (`-m module`, script or `-c`) that took it, and the pytest tests whose processes took it (a process started
by a test, Slurm jobs it submitted included, carries the test's PYTEST_CURRENT_TEST; a plugin adds the CPU the test
took in the pytest process itself), largest first. In `kinds` a pytest process counts whole, under its own kind.

    .venv/bin/python bench/process_cpu.py -- .venv/bin/pytest -n 3 tests/test_train_slurm.py
    make venv && python3 bench/process_cpu.py --log cpu.jsonl -- bash .ci/run      # the whole suite

The venv's Pythons record through a .pth file put in its site-packages for the run (tests that set their own
PYTHONPATH cannot hide it), so make the venv first; other Pythons through PYTHONPATH.

The command's output goes to stderr, the JSON alone to stdout. The machine's figure counts everything on it: run on
an otherwise quiet machine. A process ended by a signal it does not handle records nothing and lands in
`unaccounted_cpu_s`, with the non-Python work (slurmd, sshd, Prometheus, compilers).
For the run, the hook's sitecustomize module comes first on sys.path and hides any other sitecustomize.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (tokenize.py); keep it off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402

HOOK = Path(__file__).resolve().parent / "process_cpu_hook"
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # /proc/stat cpu: user nice system (idle iowait) irq softirq steal


@contextmanager
def venv_hook(venv: Path) -> Iterator[Path | None]:
    """A .pth file in the venv's site-packages that imports the recorder at every start-up, removed afterwards;
    None when there is no such venv."""
    python = venv / "bin" / "python"
    if not python.exists():
        yield None
        return
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    pth = Path(purelib) / "ft_process_cpu.pth"
    pth.write_text(f"{HOOK}\nimport process_cpu_record\n")
    try:
        yield pth
    finally:
        pth.unlink(missing_ok=True)


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot, from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def process_kind(argv: list[str]) -> str:
    """`-m module`, `-c` and the code's first line, or the script's name: what a process ran, without its arguments."""
    for flag in ("-m", "-c"):
        if flag in argv[1:]:
            first_line = (argv[argv.index(flag, 1) + 1].splitlines() or [""])[0]
            return f"{flag} {first_line[:60]}"
    scripts = [a for a in argv[1:] if not a.startswith("-")]
    return Path(scripts[0]).name if scripts else Path(argv[0]).name


def started_under(record: dict) -> str | None:
    """The test a process was started under: PYTEST_CURRENT_TEST without its phase (`path::name (call)`)."""
    test = record.get("test")
    return test.rsplit(" (", 1)[0] if test else None


def summarize(records: list[dict], top: int, key: Callable[[dict], str | None]) -> list[dict]:
    """Records grouped by key(record) (None: left out), largest CPU first."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        if (name := key(record)) is not None:
            groups[name].append(record)
    rows = [{"name": name, "processes": len(group), "cpu_s": round(sum(r["cpu_s"] for r in group), 1),
             "mean_cpu_s": round(sum(r["cpu_s"] for r in group) / len(group), 2),
             "mean_wall_s": round(sum(r["wall_s"] for r in group) / len(group), 2),
             "imported_torch": sum(r["imported_torch"] for r in group)} for name, group in groups.items()]
    return sorted(rows, key=lambda row: row["cpu_s"], reverse=True)[:top]


def tests_by_cpu(records: list[dict], in_pytest: list[dict], top: int) -> list[dict]:
    """Each test's CPU: the processes started under it, and what it took in the pytest process."""
    rows = {row["name"]: {"name": row["name"], "processes": row["processes"], "processes_cpu_s": row["cpu_s"],
                          "in_pytest_cpu_s": 0.0} for row in summarize(records, len(records), started_under)}
    for line in in_pytest:
        row = rows.setdefault(line["test"], {"name": line["test"], "processes": 0, "processes_cpu_s": 0.0})
        row["in_pytest_cpu_s"] = round(line["cpu_s"], 1)
    for row in rows.values():
        row["total_cpu_s"] = round(row["processes_cpu_s"] + row["in_pytest_cpu_s"], 1)
    return sorted(rows.values(), key=lambda row: row["total_cpu_s"], reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="kinds of process and tests listed (default 25)")
    parser.add_argument("--log", type=Path, help="keep the per-process JSON lines here (default: a temporary file)")
    parser.add_argument("--venv", type=Path, default=Path(".venv"),
                        help="the venv whose Pythons record through a .pth file for the run (default .venv)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    with tempfile.TemporaryDirectory() as scratch:
        log = args.log or Path(scratch) / "processes.jsonl"
        log.unlink(missing_ok=True)
        env = {**os.environ, "FT_PROCESS_CPU_LOG": str(log.resolve()),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])),
               "PYTEST_ADDOPTS": " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"), "-p pytest_process_cpu"]))}
        with venv_hook(args.venv) as pth:
            busy, started = machine_busy_seconds(), time.monotonic()
            returncode = subprocess.run(command, env=env, stdout=sys.stderr).returncode  # stdout: the JSON alone
            wall, busy = time.monotonic() - started, machine_busy_seconds() - busy
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    records = [line for line in lines if not line.get("in_pytest")]
    in_pytest = [line for line in lines if line.get("in_pytest")]
    accounted = sum(r["cpu_s"] for r in records)
    print(json.dumps({
        "command": command, "returncode": returncode, "venv_hook": str(pth) if pth else None, "wall_s": round(wall, 1),
        "machine_busy_cpu_s": round(busy, 1), "python_processes": len(records),
        "python_cpu_s": round(accounted, 1), "unaccounted_cpu_s": round(busy - accounted, 1),
        "python_processes_importing_torch": sum(r["imported_torch"] for r in records),
        "kinds": summarize(records, args.top, lambda record: process_kind(record["argv"])),
        "tests": tests_by_cpu(records, in_pytest, args.top),
    }, indent=2))
    sys.exit(returncode)


if __name__ == "__main__":
    main()
