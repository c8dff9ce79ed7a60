"""The ports the serving tests hand a launcher: a block of consecutive free ports outside the ephemeral range."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest
import serve_process
from serve_process import ENGINE_PORTS, PICKED_PORTS, free_port


def _listening(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_block_with_one_port_held_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's second engine binds --backend-port + 1: a block whose second port is held is not returned."""
    held_block, free_block = _two_free_blocks()
    holder = _listening(held_block + 1)
    try:
        picks: Iterator[int] = iter([held_block, free_block])
        monkeypatch.setattr(serve_process.random, "randrange", lambda low, high: next(picks))
        assert free_port(ENGINE_PORTS) == free_block
    finally:
        holder.close()


def test_picked_ports_lie_below_the_ephemeral_range_and_can_be_bound() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        first = free_port(ENGINE_PORTS)
        assert PICKED_PORTS[0] <= first and first + ENGINE_PORTS <= min(PICKED_PORTS[1], low)
        for port in range(first, first + ENGINE_PORTS):
            _listening(port).close()


def _two_free_blocks() -> tuple[int, int]:
    """Two blocks in the picked range that nothing holds now, found without free_port."""
    found = list(islice((first for first in range(PICKED_PORTS[0] + 1000, PICKED_PORTS[1], 97) if _block_free(first)),
                        2))
    assert len(found) == 2, "no two free port blocks in the picked range"
    return found[0], found[1]


def _block_free(first: int) -> bool:
    sockets = []
    try:
        for port in range(first, first + ENGINE_PORTS):
            sockets.append(_listening(port))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()
