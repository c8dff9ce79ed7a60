"""Whether an interpreter finds current bytecode for what it imports: with PYTHONDONTWRITEBYTECODE set (CI machines
set it) a module without it is compiled again by every process that imports it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

CHECK = """
import importlib, importlib.util, json, os, struct, sys
prefix = os.path.realpath(sys.argv[1]) + os.sep
for name in sys.argv[2:]:
    importlib.import_module(name)
checked, without = 0, []
for module in list(sys.modules.values()):
    source = getattr(module, "__file__", None) or ""
    if not source.endswith(".py") or not os.path.realpath(source).startswith(prefix):
        continue
    checked += 1
    try:
        with open(importlib.util.cache_from_source(source), "rb") as handle:
            flags, mtime, size = struct.unpack("<4xIII", handle.read(16))
    except (OSError, struct.error):
        without.append(module.__name__)
        continue
    stat = os.stat(source)
    if flags == 0 and (mtime, size) != (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF):
        without.append(module.__name__)
print(json.dumps({"checked": checked, "without_bytecode": sorted(without)}))
"""


def bytecode_misses(python: Path | str, prefix: Path, modules: list[str], cwd: Path) -> dict:
    """Import `modules` with `python` (writing no bytecode) and report the modules loaded from under `prefix`
    whose cached bytecode is missing or older than their source (pyc header: the source's mtime and size)."""
    done = subprocess.run([str(python), "-c", CHECK, str(prefix), *modules], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
