"""pytest plugin loaded by bench/process_cpu.py (-p pytest_process_cpu): the CPU seconds each test takes in the
pytest process itself (setup, call and teardown, all its threads), one JSON line per test to FT_PROCESS_CPU_LOG."""

import time

import pytest
from process_cpu_record import append_line


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    started = time.process_time()
    yield
    append_line({"in_pytest": True, "test": item.nodeid, "cpu_s": time.process_time() - started})
