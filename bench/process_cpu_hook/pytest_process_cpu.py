"""pytest plugin loaded by bench/process_cpu.py (-p pytest_process_cpu): the CPU seconds each test takes in the
pytest process itself (setup, call and teardown, all its threads), one JSON line per test to FT_PROCESS_CPU_LOG."""

import json
import os
import time

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    started = time.process_time()
    yield
    line = json.dumps({"in_pytest": True, "test": item.nodeid, "cpu_s": time.process_time() - started})
    fd = os.open(os.environ["FT_PROCESS_CPU_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
