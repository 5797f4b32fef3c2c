"""The stack tests: what users ship (the worker image, the compose stack), built and run for real.

They need a Docker engine and the images, which ``make test-stack`` provides (``tests/stack/engine.py``),
so ``make test`` leaves this folder out (tests/conftest.py). Each test records its figures in
``build/stack/figures.json``; ``make test-stack`` ends by printing them as one line.
"""

from __future__ import annotations

import json

import pytest

from tests.stack.engine import STATE, image_exists


@pytest.fixture(scope="session")
def figures():
    """Figures the tests measure, merged into build/stack/figures.json as each is known."""
    path = STATE / "figures.json"
    STATE.mkdir(parents=True, exist_ok=True)
    recorded = json.loads(path.read_text()) if path.exists() else {}

    def record(**values) -> None:
        recorded.update(values)
        path.write_text(json.dumps(recorded, indent=2))

    return record


@pytest.fixture(scope="session")
def worker_image() -> str:
    from shardline.orchestration.services import LOCAL_IMAGE

    assert image_exists(LOCAL_IMAGE), f"no {LOCAL_IMAGE}: run `make test-stack` (python -m tests.stack.engine up)"
    return LOCAL_IMAGE
