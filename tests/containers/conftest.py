from __future__ import annotations

import pytest

from tests.containers.podman import build_mock_image, skip_reason


@pytest.fixture(scope="session")
def mock_image() -> str:
    """The Dockerfile's mock target built from the local Debian base, once per session."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return build_mock_image()
