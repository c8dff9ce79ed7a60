"""Python processes outside the venv, run under bench/process_cpu.py (this folder first on PYTHONPATH), record too."""

import process_cpu_record  # noqa: F401
