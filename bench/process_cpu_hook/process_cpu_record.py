"""Imported at start-up by every Python process run under bench/process_cpu.py (by a .pth file in the venv's
site-packages, which a test's own PYTHONPATH cannot hide, and by sitecustomize on PYTHONPATH for other Pythons): at
exit, one JSON line with the process's own CPU seconds, its command and the pytest test it was started under
(PYTEST_CURRENT_TEST, inherited from the test that started it) goes to FT_PROCESS_CPU_LOG. A process ended by a
signal it does not handle writes nothing (bench/process_cpu.py reports that remainder)."""

import atexit
import json
import os
import resource
import sys
import time

_LOG = os.environ.get("FT_PROCESS_CPU_LOG")  # read at start-up: a process may change its environment
_STARTED = time.monotonic()


def append_line(record: dict) -> None:
    """One JSON line to FT_PROCESS_CPU_LOG, in one write under O_APPEND: lines of concurrent processes stay whole."""
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _record() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    append_line({"pid": os.getpid(), "argv": sys.orig_argv, "cpu_s": usage.ru_utime + usage.ru_stime,
                 "wall_s": time.monotonic() - _STARTED, "imported_torch": "torch" in sys.modules,
                 "test": os.environ.get("PYTEST_CURRENT_TEST")})


if _LOG:
    atexit.register(_record)
