"""The venv `make venv` builds holds bytecode for its packages (compileall in the Makefile): with
PYTHONDONTWRITEBYTECODE set (CI machines set it) a module without it is compiled again by every process that imports
it. (The cluster's environment is left to its jobs, which write it: docs/environment.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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


PROCESS_IMPORTS = (
    "workloads.train.finetune",  # a training rank
    "transformers.models.llama.modeling_llama",  # the model family it loads: SmolLM2 and the tests' tiny models
    "transformers.models.qwen3.modeling_qwen3",  # the shipped GPU configs' family
    "workloads.serve.engine.server",  # the peft engine
    "transformers.cli.transformers", "transformers.cli.serve",  # the transformers engine of a merged run
    "workloads.eval.evaluate", "workloads.checks.gpu", "workloads.train.export",
    "infra.commands.cli", "infra.program",  # ftstack and the Pulumi program it runs
)
"""what each kind of process the suite and the jobs start imports first (the Makefile's COMPILE_SKIP leaves the
packages' test suites and the other model families out)"""


def test_every_kind_of_process_finds_bytecode_for_every_package_it_imports() -> None:
    """A training rank alone imports about 3,700 modules of torch, transformers, peft and datasets from the venv;
    none is compiled again at its start (measured here: the rank's imports took 27 s of CPU without bytecode, 12 s
    with). The check runs in a fresh interpreter that writes no bytecode and imports what every kind of process
    does, over the modules loaded from site-packages: the cached file missing, or its header (the source's mtime
    and size) not the source's, is a miss."""
    done = subprocess.run([sys.executable, "-c", CHECK, sysconfig.get_path("purelib"), *PROCESS_IMPORTS],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["checked"] > 3000, report
    assert report["without_bytecode"] == [], (
        f"{len(report['without_bytecode'])} of {report['checked']} modules imported from the venv have no current "
        f"bytecode (make venv compiles it): {report['without_bytecode'][:10]}")
