"""Where the tests read pinned upstream material (charts, CRDs, reference templates): the folder named by
``FT_UPSTREAM`` (a mirror of ``../shared/upstream``'s shape), else ``../shared/upstream`` beside the checkout.
Nothing of it is copied into the project (``/work/shared/upstream/README.md`` says where each file comes from)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

UPSTREAM_ENV = "FT_UPSTREAM"
CHECKOUT = Path(__file__).resolve().parents[1]


def upstream_root() -> Path:
    chosen = os.environ.get(UPSTREAM_ENV)
    return Path(chosen).expanduser() if chosen else CHECKOUT.parent / "shared" / "upstream"


def upstream_file(relative: str) -> Path:
    """``<upstream>/<relative>``; the test fails with one line naming the file and both places when it is absent."""
    path = upstream_root() / relative
    if not path.is_file():
        pytest.fail(f"upstream file {relative}: not in {upstream_root()} (set {UPSTREAM_ENV} to a folder of "
                    f"../shared/upstream's shape)", pytrace=False)
    return path
