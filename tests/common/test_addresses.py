"""Bind vs advertise: what peers on other hosts are told to dial (common/addresses.py)."""

from __future__ import annotations

import pytest

from common.addresses import (
    TcpEndpoint,
    advertise_host,
    advertised_endpoint,
    advertised_events,
    check_advertised,
    check_bind_advertise,
    check_push_side_channel,
    default_events_bind,
    dialable,
    is_loopback,
    loopback_to_remote_router,
    reachable_off_host,
    is_wildcard,
    nixl_advertise_host,
    parse_tcp,
    with_host,
)
from common.errors import AddressError


@pytest.mark.parametrize(("host", "wildcard"), [
    ("0.0.0.0", True), ("::", True), ("[::]", True), ("*", True), ("", True),
    ("127.0.0.1", False), ("198.18.0.2", False), ("::1", False), ("prefill-0", False),
])
def test_is_wildcard(host: str, wildcard: bool) -> None:
    assert is_wildcard(host) is wildcard


@pytest.mark.parametrize(("endpoint", "parsed"), [
    ("tcp://127.0.0.1:5550", TcpEndpoint("127.0.0.1", "5550")),
    ("tcp://0.0.0.0:0", TcpEndpoint("0.0.0.0", "0")),
    ("tcp://*:*", TcpEndpoint("*", "*")),
    ("tcp://[::1]:5560", TcpEndpoint("::1", "5560")),
    ("tcp://router:5550", TcpEndpoint("router", "5550")),
    ("ipc:///tmp/x.sock", None),
    ("inproc://x", None),
])
def test_parse_tcp(endpoint: str, parsed: TcpEndpoint | None) -> None:
    assert parse_tcp(endpoint) == parsed


def test_parse_tcp_refuses_an_endpoint_without_port() -> None:
    with pytest.raises(AddressError, match="tcp://HOST:PORT"):
        parse_tcp("tcp://10.0.0.5")


@pytest.mark.parametrize(("endpoint", "host", "expected"), [
    ("tcp://0.0.0.0:5551", "198.18.0.1", "tcp://198.18.0.1:5551"),
    ("tcp://127.0.0.1:0", "*", "tcp://*:0"),
    ("tcp://0.0.0.0:5551", "fd00::1", "tcp://[fd00::1]:5551"),
])
def test_with_host(endpoint: str, host: str, expected: str) -> None:
    assert with_host(endpoint, host) == expected


@pytest.mark.parametrize(("advertise", "host"), [
    ("tcp://198.18.0.2:5560", "198.18.0.2"), ("198.18.0.2", "198.18.0.2"), ("prefill", "prefill"),
    ("[fd00::2]", "fd00::2"), ("tcp://[fd00::2]:1", "fd00::2"),
])
def test_advertise_host(advertise: str, host: str) -> None:
    assert advertise_host(advertise) == host


def test_advertise_host_refuses_other_transports_and_a_port_without_scheme() -> None:
    with pytest.raises(AddressError, match="only tcp://"):
        advertise_host("ipc:///tmp/w.sock")
    with pytest.raises(AddressError, match="needs the scheme"):
        advertise_host("prefill:5560")


@pytest.mark.parametrize("advertise", ["tcp://0.0.0.0:5560", "0.0.0.0", "::", "tcp://*:5560", "tcp://[::]:1"])
def test_a_wildcard_is_never_advertised(advertise: str) -> None:
    with pytest.raises(AddressError, match="--advertise .*wildcard"):
        check_advertised(advertise, "--advertise")


@pytest.mark.parametrize(("bind", "advertise", "refused"), [
    ("tcp://127.0.0.1:0", "", False),  # loopback bound, loopback registered: one host, as before
    ("tcp://198.18.0.2:5560", "", False),
    ("tcp://0.0.0.0:5560", "", True),  # would register tcp://0.0.0.0:5560
    ("tcp://0.0.0.0:5560", "198.18.0.2", False),
    ("tcp://0.0.0.0:5560", "tcp://198.18.0.2:5560", False),
    ("tcp://0.0.0.0:5560", "tcp://0.0.0.0:5560", True),
    ("ipc:///tmp/w.sock", "", False),
])
def test_check_bind_advertise(bind: str, advertise: str, refused: bool) -> None:
    if refused:
        with pytest.raises(AddressError, match="--endpoint|--advertise"):
            check_bind_advertise(bind, advertise, "--endpoint", "--advertise")
    else:
        check_bind_advertise(bind, advertise, "--endpoint", "--advertise")


@pytest.mark.parametrize(("bound", "advertise", "expected"), [
    ("tcp://127.0.0.1:41000", "", "tcp://127.0.0.1:41000"),
    ("tcp://0.0.0.0:41000", "198.18.0.2", "tcp://198.18.0.2:41000"),  # a bare host keeps the bound port
    ("tcp://0.0.0.0:41000", "tcp://prefill:5560", "tcp://prefill:5560"),  # a full endpoint is taken as is (NAT)
])
def test_advertised_endpoint(bound: str, advertise: str, expected: str) -> None:
    assert advertised_endpoint(bound, advertise) == expected


def test_advertised_endpoint_refuses_a_wildcard_bound_with_nothing_advertised() -> None:
    with pytest.raises(AddressError, match="binds every interface"):
        advertised_endpoint("tcp://0.0.0.0:41000", "")


@pytest.mark.parametrize(("bound", "advertise", "expected"), [
    ("tcp://0.0.0.0:41001", "", "tcp://0.0.0.0:41001"),  # told as is: each worker dials the router's host
    ("tcp://0.0.0.0:41001", "198.18.0.1", "tcp://198.18.0.1:41001"),
    ("tcp://127.0.0.1:41001", "", "tcp://127.0.0.1:41001"),
])
def test_advertised_events(bound: str, advertise: str, expected: str) -> None:
    assert advertised_events(bound, advertise) == expected


@pytest.mark.parametrize(("told", "via", "expected"), [
    ("tcp://0.0.0.0:41001", "tcp://198.18.0.1:5550", "tcp://198.18.0.1:41001"),
    ("tcp://0.0.0.0:41001", "tcp://router:5550", "tcp://router:41001"),
    ("tcp://198.18.0.9:41001", "tcp://198.18.0.1:5550", "tcp://198.18.0.9:41001"),  # advertised: untouched
    ("tcp://127.0.0.1:41001", "tcp://127.0.0.1:5550", "tcp://127.0.0.1:41001"),
    ("ipc:///tmp/e.sock", "tcp://198.18.0.1:5550", "ipc:///tmp/e.sock"),
])
def test_dialable(told: str, via: str, expected: str) -> None:
    assert dialable(told, via) == expected


def test_dialable_needs_a_host_to_substitute() -> None:
    with pytest.raises(AddressError, match="names no host"):
        dialable("tcp://0.0.0.0:41001", "tcp://0.0.0.0:5550")


@pytest.mark.parametrize(("nixl_host", "nixl_advertise", "advertise", "expected"), [
    ("127.0.0.1", "", "", "127.0.0.1"),  # the one-host default
    ("198.18.0.2", "", "tcp://198.18.0.2:5560", "198.18.0.2"),
    ("0.0.0.0", "", "tcp://198.18.0.2:5560", "198.18.0.2"),  # every interface: --advertise's host
    ("0.0.0.0", "", "198.18.0.2", "198.18.0.2"),
    ("::", "", "tcp://[fd00::2]:5560", "fd00::2"),
    ("0.0.0.0", "10.1.0.2", "tcp://198.18.0.2:5560", "10.1.0.2"),  # explicit wins (a separate KV network)
    ("127.0.0.1", "prefill-b", "", "prefill-b"),
])
def test_nixl_advertise_host(nixl_host: str, nixl_advertise: str, advertise: str, expected: str) -> None:
    assert nixl_advertise_host(nixl_host, nixl_advertise, advertise) == expected


@pytest.mark.parametrize(("nixl_host", "nixl_advertise", "advertise", "match"), [
    ("0.0.0.0", "", "", "--nixl-host 0.0.0.0 binds every interface"),
    ("0.0.0.0", "", "tcp://0.0.0.0:5560", "--nixl-host 0.0.0.0 binds every interface"),
    ("127.0.0.1", "0.0.0.0", "", "--nixl-advertise 0.0.0.0"),
    ("0.0.0.0", "::", "198.18.0.2", "--nixl-advertise ::"),
])
def test_nixl_advertise_host_refusals(nixl_host: str, nixl_advertise: str, advertise: str, match: str) -> None:
    with pytest.raises(AddressError, match=match):
        nixl_advertise_host(nixl_host, nixl_advertise, advertise)


@pytest.mark.parametrize(("router", "expected"), [
    ("tcp://127.0.0.1:5550", "tcp://127.0.0.1:0"),
    ("tcp://0.0.0.0:5550", "tcp://0.0.0.0:0"),
    ("tcp://198.18.0.1:5550", "tcp://198.18.0.1:0"),
    ("ipc:///tmp/r.sock", "tcp://127.0.0.1:0"),
])
def test_default_events_bind(router: str, expected: str) -> None:
    assert default_events_bind(router) == expected


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.1.1", True), ("localhost", True), ("::1", True),
    ("198.18.0.2", False), ("0.0.0.0", False), ("prefill", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("nixl_host", "kv_transfer", "role", "refused"), [
    ("0.0.0.0", "push", "decode", True),   # prefill engines would dial 0.0.0.0: their own host
    ("::", "push", "both", True),
    ("0.0.0.0", "push", "prefill", False),  # a prefill engine's address travels in our params, rewritten
    ("0.0.0.0", "pull", "decode", False),  # pull: nobody dials the decode engine
    ("10.0.0.5", "push", "decode", False),
])
def test_a_pushing_decode_engine_binds_a_dialable_side_channel(nixl_host: str, kv_transfer: str, role: str,
                                                               refused: bool) -> None:
    if refused:
        with pytest.raises(AddressError, match="--kv-transfer push"):
            check_push_side_channel(nixl_host, kv_transfer, role)
    else:
        check_push_side_channel(nixl_host, kv_transfer, role)


@pytest.mark.parametrize(("endpoint", "reachable"), [
    ("tcp://10.0.0.5:5570", True), ("tcp://kvtier-b:5570", True), ("tcp://[fd00::5]:5570", True),
    ("tcp://127.0.0.1:5570", False), ("tcp://localhost:5570", False), ("tcp://[::1]:5570", False),
    ("tcp://0.0.0.0:5570", False), ("ipc:///run/kvtier.sock", False), ("tcp://nonsense", False),
])
def test_reachable_off_host(endpoint: str, reachable: bool) -> None:
    assert reachable_off_host(endpoint) is reachable


@pytest.mark.parametrize(("advertised", "routers", "expected"), [
    ("tcp://127.0.0.1:5570", "tcp://10.0.0.1:5550", True),  # the case that named kvtier-b to C
    ("tcp://127.0.0.1:5570", "tcp://127.0.0.1:5550,tcp://10.0.0.1:5550", True),  # one replica elsewhere is enough
    ("tcp://127.0.0.1:5570", "tcp://127.0.0.1:5550", False),  # one host: loopback is right
    ("tcp://10.0.0.2:5570", "tcp://10.0.0.1:5550", False),
    ("tcp://127.0.0.1:5570", "", False),  # standalone
])
def test_loopback_to_remote_router(advertised: str, routers: str, expected: bool) -> None:
    assert loopback_to_remote_router(advertised, routers) is expected
