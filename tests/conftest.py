"""Fixtures shared across test trees."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vllm_reference(tmp_path_factory):
    """One vLLM engine doing both, its outputs kept for the session (tests/e2e/reference.py): used by the real
    P/D tests in tests/e2e and tests/multihost."""
    # Imported here: unit tests need none of it.
    from tests.e2e.reference import Reference

    return Reference(tmp_path_factory.mktemp("vllm-reference"))
