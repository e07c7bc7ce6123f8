"""Fixtures for tests on namespaced hosts (tests/harness/hosts.py): hosts, and splitserve services placed on them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.harness.hosts import Hosts, hosts
from common.errors import HostsUnavailable


@contextlib.contextmanager
def _host_factory() -> Iterator[Callable[[int], Hosts]]:
    with contextlib.ExitStack() as stack:

        def make(n: int) -> Hosts:
            try:
                return stack.enter_context(hosts(n))
            except HostsUnavailable as exc:
                pytest.skip(f"no namespaced hosts here: {exc}")

        yield make


@pytest.fixture
def make_hosts() -> Iterator[Callable[[int], Hosts]]:
    """``make_hosts(n)``: n hosts, torn down after the test (skips where namespaces cannot be made)."""
    with _host_factory() as make:
        yield make


@pytest.fixture(scope="module")
def make_module_hosts() -> Iterator[Callable[[int], Hosts]]:
    with _host_factory() as make:
        yield make
