"""Bind vs advertise: the address a socket binds and the one peers on other hosts are told to dial.

A socket may bind a wildcard (0.0.0.0, ::, ``*``: every interface) but a peer cannot dial one: connecting to
0.0.0.0 reaches the *dialer's own* host. So every address handed to a peer (registered with the router, put in
KV-transfer params, told in a RegisterAck) is either given explicitly (``--advertise``, ``--nixl-advertise``,
``--events-advertise``) or derived from one that is routable; a wildcard is never advertised. Defaults for
*binding* stay 127.0.0.1 (docs/architecture.md#processes).
"""

from __future__ import annotations

from typing import NamedTuple

from common.errors import AddressError

# Hosts that mean "every interface" when bound; "" is ZeroMQ's and Python's "any" too.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*", "", "0:0:0:0:0:0:0:0"})


class TcpEndpoint(NamedTuple):
    host: str  # without IPv6 brackets
    port: str  # as written: a number, "0" or "*" (ZeroMQ: any free port)


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in WILDCARD_HOSTS


def parse_tcp(endpoint: str) -> TcpEndpoint | None:
    """Host and port of a ZeroMQ ``tcp://host:port`` endpoint; None for other transports (ipc://, inproc://)."""
    if not endpoint.startswith("tcp://"):
        return None
    rest = endpoint[len("tcp://"):]
    # ZeroMQ's "tcp://iface;host:port" names a source interface before ';': the part peers dial follows it.
    rest = rest.rsplit(";", 1)[-1]
    host, sep, port = rest.rpartition(":")
    if not sep or not port:
        raise AddressError(f"{endpoint!r} is not tcp://HOST:PORT")
    return TcpEndpoint(host.strip("[]"), port)


def with_host(endpoint: str, host: str) -> str:
    """``endpoint`` with its host replaced (IPv6 hosts bracketed)."""
    parsed = parse_tcp(endpoint)
    if parsed is None:
        raise AddressError(f"{endpoint!r} is not a tcp:// endpoint")
    return f"tcp://{_bracketed(host)}:{parsed.port}"


def advertise_host(advertise: str) -> str:
    """The host part of an ``--advertise`` value: a ``tcp://HOST:PORT`` endpoint or a bare host name/address."""
    parsed = parse_tcp(advertise)
    if parsed is not None:
        return parsed.host
    if "://" in advertise:
        raise AddressError(f"{advertise!r}: only tcp:// endpoints can be advertised to other hosts")
    host = advertise.strip("[]")
    if ":" in host and not _is_ipv6(host):
        raise AddressError(f"{advertise!r}: a host with a port needs the scheme (tcp://{advertise})")
    return host


def check_advertised(advertise: str, flag: str) -> str:
    """``advertise`` unchanged if a peer can dial it; AddressError naming ``flag`` if its host is a wildcard."""
    if advertise and is_wildcard(advertise_host(advertise)):
        raise AddressError(f"{flag} {advertise}: a wildcard address cannot be dialed by peers; advertise this "
                           "host's routable address or name (e.g. 10.0.0.5 or tcp://10.0.0.5:5560)")
    return advertise


def check_bind_advertise(bind: str, advertise: str, bind_flag: str, advertise_flag: str) -> None:
    """Refuse a configuration that would advertise a wildcard: an advertised wildcard, or a wildcard bind with
    nothing advertised (the bound endpoint would be registered as is)."""
    if advertise:
        check_advertised(advertise, advertise_flag)
        return
    parsed = parse_tcp(bind)
    if parsed is not None and is_wildcard(parsed.host):
        raise AddressError(f"{bind_flag} {bind} binds every interface; give {advertise_flag} with the address "
                           "peers dial (a host, e.g. 10.0.0.5, or an endpoint, e.g. tcp://10.0.0.5:5560)")


def advertised_endpoint(bound: str, advertise: str, flag: str = "--advertise") -> str:
    """What peers are told to dial, given the endpoint actually bound (its real port, after a bind to port 0).

    ``advertise`` "": the bound endpoint (refused if it is a wildcard); a full endpoint: itself; a bare host:
    the bound port on that host.
    """
    if not advertise:
        check_bind_advertise(bound, "", "bound endpoint", flag)
        return bound
    check_advertised(advertise, flag)
    if parse_tcp(advertise) is not None:
        return advertise
    return with_host(bound, advertise.strip("[]"))


def dialable(told: str, via: str) -> str:
    """An endpoint a peer told us (``told``), made dialable from here: a wildcard host (the peer bound every
    interface and advertised nothing) is replaced by the host we reached that peer at (``via``, our
    connection's endpoint). Other endpoints are returned unchanged."""
    parsed = parse_tcp(told)
    if parsed is None or not is_wildcard(parsed.host):
        return told
    reached = parse_tcp(via)
    if reached is None or is_wildcard(reached.host):
        raise AddressError(f"{told} binds every interface and {via!r} names no host to dial it by")
    return with_host(told, reached.host)


def nixl_advertise_host(nixl_host: str, nixl_advertise: str, advertise: str) -> str:
    """The host a decode engine dials for this engine's NIXL side channel (vLLM's handshake socket).

    ``--nixl-advertise`` if given; else ``--nixl-host`` when it is one address; else (bound to every interface)
    the host part of the worker's ``--advertise``. AddressError when none of them names a dialable host.
    """
    if nixl_advertise:
        if is_wildcard(nixl_advertise):
            raise AddressError(f"--nixl-advertise {nixl_advertise}: a wildcard address cannot be dialed by peers")
        return nixl_advertise.strip("[]")
    if not is_wildcard(nixl_host):
        return nixl_host.strip("[]")
    host = advertise_host(advertise) if advertise else ""
    if is_wildcard(host):
        raise AddressError(f"--nixl-host {nixl_host} binds every interface; give --nixl-advertise (or --advertise, "
                           "whose host is used) with the address decode engines dial")
    return host


def check_push_side_channel(nixl_host: str, kv_transfer: str, role: str) -> None:
    """Push (vLLM's NixlPushConnector) makes the prefill engine dial the *decode* engine's side channel at the
    address the decode engine puts in its block registration: its bind address, which we cannot rewrite (it
    travels inside a NIXL notification). So a decode-capable engine that pushes binds one dialable address."""
    if kv_transfer == "push" and role != "prefill" and is_wildcard(nixl_host):
        raise AddressError(f"--nixl-host {nixl_host} binds every interface, but with --kv-transfer push prefill "
                           "engines dial this engine's side channel at its bind address: bind the address they "
                           "reach it by")


def _is_ipv6(host: str) -> bool:
    import ipaddress

    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def advertised_events(bound: str, advertise: str) -> str:
    """The router's KV-event endpoint as told to workers: like ``advertised_endpoint``, except that a wildcard
    bind with nothing advertised is told as is and each worker dials it at the router's host (``dialable``)."""
    if not advertise:
        return bound
    return advertised_endpoint(bound, advertise, "--events-advertise")


def default_events_bind(router_endpoint: str) -> str:
    """Where the router's KV-event SUB binds when not told: the router socket's host, a free port (a router
    reachable from other hosts takes their events too); loopback for a non-tcp router endpoint."""
    parsed = parse_tcp(router_endpoint)
    return with_host("tcp://127.0.0.1:0", parsed.host if parsed is not None else "127.0.0.1")


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def reachable_off_host(endpoint: str) -> bool:
    """Whether a peer on another host can dial ``endpoint`` as told: not a loopback tcp:// address, not ipc://
    or inproc:// (a kvtier bound to 127.0.0.1 beside its worker is node-local: the router never names it to a
    worker on another node, which would dial its own loopback)."""
    try:
        parsed = parse_tcp(endpoint)
    except AddressError:
        return False
    return parsed is not None and not is_loopback(parsed.host) and not is_wildcard(parsed.host)


def loopback_to_remote_router(advertised: str, router_endpoints: str) -> bool:
    """A service registers a loopback address (``advertised``) with a router on another host (any of the
    comma-separated ``router_endpoints`` not on loopback): peers on other hosts cannot use it."""
    if reachable_off_host(advertised) or not advertised.startswith("tcp://"):
        return False
    return any(reachable_off_host(r.strip()) for r in router_endpoints.split(",") if r.strip())
