"""Where a command's CPU goes, per Python process (issue 42, item 13): runs the command with every Python process
it starts, however far down (pytest workers, Slurm jobs, torchrun ranks, servers), recording its own CPU seconds at
exit, and prints JSON: the machine's busy CPU over the run, the part those processes account for, the kinds of
process (`-m module`, script or `-c`) that took it, and the pytest tests whose processes took it (a process started
by a test, Slurm jobs it submitted included, carries the test's PYTEST_CURRENT_TEST; a plugin adds the CPU the test
took in the pytest process itself), largest first. In `kinds` a pytest process counts whole, under its own kind.

    .venv/bin/python bench/process_cpu.py -- .venv/bin/pytest -n 3 tests/test_train_slurm.py
    make venv && python3 bench/process_cpu.py --log cpu.jsonl -- bash .ci/run      # the whole suite
    python3 bench/process_cpu.py --from-log cpu.jsonl --junit junit.xml --top 2000 --markdown   # its per-test table

The per-test table puts each test's seconds from pytest's `--junitxml` file (setup, call and teardown; run the
suite with `PYTEST_ADDOPTS="--junitxml=junit.xml"`) beside its CPU seconds; `--from-log` makes it again from a
kept `--log` without running anything.

The venv's Pythons record through a .pth file put in its site-packages for the run (tests that set their own
PYTHONPATH cannot hide it), so make the venv first; other Pythons through PYTHONPATH.

The command's output goes to stderr, the JSON alone to stdout. The machine's figure counts everything on it: run on
an otherwise quiet machine. A process ended by a signal it does not handle records nothing and lands in
`unaccounted_cpu_s`, with the non-Python work (slurmd, sshd, Prometheus, Chromium, compilers).

`--all-processes` (root) accounts for that part too, by command name: the kernel's process accounting (acct(2))
writes a record for every process that exits during the run, however it ends, and /proc gives what the processes
still alive at the end (daemons the run started, kernel threads) took during it.
For the run, the hook's sitecustomize module comes first on sys.path and hides any other sitecustomize.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (tokenize.py); keep it off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager, nullcontext  # noqa: E402

HOOK = Path(__file__).resolve().parent / "process_cpu_hook"
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # /proc/stat cpu: user nice system (idle iowait) irq softirq steal
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
"""linux/acct.h's struct acct_v3, the record the kernel writes per exiting process: flags, version, tty, exit code,
uid, gid, pid, ppid, creation time (epoch s), elapsed (AHZ ticks, float), then 8 comp_t (user and system time
first) and the command name."""
ACCT_HZ = 100  # AHZ, the unit of acct_v3's times
ACCOUNTING_ON = "FT_PROCESS_CPU_ACCT"
"""set for the measured command while --all-processes has the kernel's process accounting on (its file's path)"""


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


def comp_t_value(value: int) -> int:
    """A comp_t (13-bit mantissa, 3-bit base-8 exponent) as the integer it stands for."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_accounting(path: Path) -> list[dict]:
    """The acct_v3 records in `path`: command name, pid, creation time and CPU seconds."""
    data = path.read_bytes()
    records = []
    for offset in range(0, len(data) - len(data) % ACCT_V3.size, ACCT_V3.size):
        _, version, _, _, _, _, pid, _, btime, _, utime, stime, *_, comm = ACCT_V3.unpack_from(data, offset)
        if version & 0x7F != 3:
            raise ValueError(f"{path}: the record at byte {offset} is version {version & 0x7F}, not acct_v3")
        records.append({"command": comm.split(b"\0", 1)[0].decode(errors="replace"), "pid": pid, "btime": btime,
                        "cpu_s": (comp_t_value(utime) + comp_t_value(stime)) / ACCT_HZ})
    return records


@contextmanager
def kernel_accounting(path: Path) -> Iterator[None]:
    """BSD process accounting into `path` (created) while the block runs; switched off afterwards. The kernel keeps
    one accounting file for the machine, so a run inside another (the suite's own test of this option, under a
    whole-suite measurement) would take it over and switch it off: that is refused (ACCOUNTING_ON)."""
    if os.environ.get(ACCOUNTING_ON):
        raise SystemExit(f"process_cpu: --all-processes: process accounting is already on for an outer run "
                         f"({ACCOUNTING_ON}={os.environ[ACCOUNTING_ON]}); the kernel keeps one file for the machine")
    path.touch()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(path).encode()) != 0:
        error = ctypes.get_errno()
        raise SystemExit(f"process_cpu: --all-processes: acct({path}): {os.strerror(error)} (needs root)")
    try:
        yield
    finally:
        libc.acct(None)


def live_processes() -> dict[int, tuple[int, str, float]]:
    """pid -> (start time in clock ticks since boot, command name, CPU seconds so far) of every process now."""
    ticks = os.sysconf("SC_CLK_TCK")
    live = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        fields = text[text.rindex(")") + 2:].split()  # from field 3 (state): utime is 14, stime 15, starttime 22
        live[int(stat.parent.name)] = (int(fields[19]), text[text.index("(") + 1:text.rindex(")")],
                                       (int(fields[11]) + int(fields[12])) / ticks)
    return live


def all_processes(exited: list[dict], before: dict[int, tuple[int, str, float]],
                  after: dict[int, tuple[int, str, float]], started_epoch: float, busy: float, top: int) -> dict:
    """Every process's CPU during the run by command name: those that exited (less what one alive before the run had
    already taken) and those still alive at the end (what they took since the start)."""
    for record in exited:
        if record["btime"] < started_epoch - 1 and record["pid"] in before:
            record["cpu_s"] = max(0.0, record["cpu_s"] - before[record["pid"]][2])

    def since_start(pid: int, start: int, cpu: float) -> float:  # the same process (pid and start time) as before
        earlier = before.get(pid)
        return cpu - earlier[2] if earlier and earlier[0] == start else cpu

    running = [{"command": command, "cpu_s": since_start(pid, start, cpu)}
               for pid, (start, command, cpu) in after.items()]
    running = [row for row in running if row["cpu_s"] > 0]

    def by_command(rows: list[dict]) -> list[dict]:
        groups: dict[str, list[dict]] = defaultdict(list)
        for row in rows:
            groups[row["command"]].append(row)
        table = [{"name": name, "processes": len(group), "cpu_s": round(sum(r["cpu_s"] for r in group), 2)}
                 for name, group in groups.items()]
        return sorted(table, key=lambda row: row["cpu_s"], reverse=True)[:top]

    exited_cpu, running_cpu = sum(r["cpu_s"] for r in exited), sum(r["cpu_s"] for r in running)
    return {"exited": len(exited), "exited_cpu_s": round(exited_cpu, 1), "running_cpu_s": round(running_cpu, 1),
            "unaccounted_cpu_s": round(busy - exited_cpu - running_cpu, 1),
            "exited_by_command": by_command(exited), "running_by_command": by_command(running)}


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


def junit_nodeid(classname: str, name: str, root: Path) -> str:
    """pytest's node id of a junit testcase: `tests.test_x.TestY` and `test_z[p]` -> `tests/test_x.py::TestY::test_z[p]`
    (the longest prefix of the class name that is a file under `root` is the module)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        if (root / Path(*parts[:cut])).with_suffix(".py").is_file():
            return "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], name])
    return "::".join([classname.replace(".", "/") + ".py", name])


def junit_seconds(path: Path, root: Path) -> dict[str, float]:
    """Each testcase's seconds (setup, call and teardown) in a pytest --junitxml file, by node id."""
    import xml.etree.ElementTree as ElementTree

    return {junit_nodeid(case.get("classname", ""), case.get("name", ""), root): float(case.get("time") or 0)
            for case in ElementTree.parse(path).getroot().iter("testcase")}


def with_junit(tests: list[dict], junit: dict[str, float]) -> list[dict]:
    """The tests' rows with their junit seconds beside their CPU seconds (None for a test junit does not list)."""
    return [{**row, "junit_s": round(junit[row["name"]], 1) if row["name"] in junit else None} for row in tests]


def markdown_table(tests: list[dict]) -> str:
    """The per-test table as Markdown: test, junit seconds, CPU seconds (its processes and in pytest), processes."""
    lines = ["| test | junit s | CPU s | of which in pytest | processes |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| `{row['name']}` | {'' if row.get('junit_s') is None else row['junit_s']} | {row['total_cpu_s']} "
              f"| {row['in_pytest_cpu_s']} | {row['processes']} |" for row in tests]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="kinds of process and tests listed (default 25)")
    parser.add_argument("--log", type=Path,
                        help="keep the per-process JSON lines here, and with --all-processes the kernel's records "
                             "beside them (LOG.pacct; default: temporary files)")
    parser.add_argument("--venv", type=Path, default=Path(".venv"),
                        help="the venv whose Pythons record through a .pth file for the run (default .venv)")
    parser.add_argument("--all-processes", action="store_true",
                        help="also every process by command name, through the kernel's process accounting (root)")
    parser.add_argument("--from-log", type=Path, metavar="LOG",
                        help="run nothing: the kinds and tests of an earlier run's --log (machine figures unknown)")
    parser.add_argument("--junit", type=Path, metavar="FILE",
                        help="pytest's --junitxml file of the run: each test's seconds beside its CPU (junit_s)")
    parser.add_argument("--markdown", action="store_true", help="print the per-test table as Markdown, not JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command and not args.from_log:
        parser.error("give the command to measure after --, or --from-log LOG")
    return args


def measure(args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """Run the command with the recorders on: the run's own figures, and the recorded lines."""
    with tempfile.TemporaryDirectory() as scratch:
        log = args.log or Path(scratch) / "processes.jsonl"
        log.unlink(missing_ok=True)
        accounting = log.with_name(log.name + ".pacct") if args.log else Path(scratch) / "pacct"
        env = {**os.environ, "FT_PROCESS_CPU_LOG": str(log.resolve()),
               **({ACCOUNTING_ON: str(accounting.resolve())} if args.all_processes else {}),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])),
               "PYTEST_ADDOPTS": " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"), "-p pytest_process_cpu"]))}
        with venv_hook(args.venv) as pth, kernel_accounting(accounting) if args.all_processes else nullcontext():
            before, started_epoch = live_processes() if args.all_processes else {}, time.time()
            busy, started = machine_busy_seconds(), time.monotonic()
            returncode = subprocess.run(args.command, env=env, stdout=sys.stderr).returncode  # stdout: the JSON
            wall, busy = time.monotonic() - started, machine_busy_seconds() - busy
            after = live_processes() if args.all_processes else {}
        every = all_processes(read_accounting(accounting), before, after, started_epoch, busy, args.top) \
            if args.all_processes else None
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    run = {"command": args.command, "returncode": returncode, "venv_hook": str(pth) if pth else None,
           "wall_s": round(wall, 1), "machine_busy_cpu_s": round(busy, 1), **({"all_processes": every} if every else {})}
    return run, lines


def main() -> None:
    args = parse_args()
    if args.from_log:
        run = {"from_log": str(args.from_log), "returncode": 0}
        lines = [json.loads(line) for line in args.from_log.read_text().splitlines()]
    else:
        run, lines = measure(args)
    records = [line for line in lines if not line.get("in_pytest")]
    in_pytest = [line for line in lines if line.get("in_pytest")]
    accounted = sum(r["cpu_s"] for r in records)
    tests = tests_by_cpu(records, in_pytest, args.top)
    if args.junit:
        tests = with_junit(tests, junit_seconds(args.junit, Path.cwd()))
    if args.markdown:
        sys.stdout.write(markdown_table(tests))
        sys.exit(run["returncode"])
    busy = run.get("machine_busy_cpu_s")
    every = run.pop("all_processes", None)
    print(json.dumps({
        **run, "python_processes": len(records), "python_cpu_s": round(accounted, 1),
        "unaccounted_cpu_s": round(busy - accounted, 1) if busy is not None else None,
        "python_processes_importing_torch": sum(r["imported_torch"] for r in records),
        "kinds": summarize(records, args.top, lambda record: process_kind(record["argv"])),
        "tests": tests, **({"all_processes": every} if every else {}),
    }, indent=2))
    sys.exit(run["returncode"])


if __name__ == "__main__":
    main()
