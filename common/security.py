"""ZeroMQ CURVE for sockets that cross hosts: keys from files, and a ZAP check of who may connect.

A cluster has one server keypair (every bound socket: router, workers, kvtier) and one or more client keypairs
(every connecting socket). Servers accept only client public keys found in ``<dir>/clients/``; a peer without
them never completes the handshake. Loopback deployments run without CURVE (the default).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from common.errors import SplitserveError


@dataclass(frozen=True, slots=True)
class CurveKeys:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    # Directory of *.key files holding the client public keys servers accept.
    allowed_clients_dir: Path


def make_curve_keys(out_dir: Path) -> Path:
    """Write a server keypair and one client keypair (clients/client.key) under ``out_dir``."""
    (out_dir / "clients").mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(out_dir, "server")
    public, secret = zmq.auth.create_certificates(out_dir, "client")
    Path(public).rename(out_dir / "clients" / "client.key")
    return out_dir


def load_curve_keys(keys_dir: Path) -> CurveKeys:
    try:
        server_public, server_secret = zmq.auth.load_certificate(keys_dir / "server.key_secret")
        client_public, client_secret = zmq.auth.load_certificate(keys_dir / "client.key_secret")
    except (OSError, ValueError) as exc:
        raise SplitserveError(f"CURVE keys in {keys_dir} are missing or broken: {exc}") from exc
    assert server_secret is not None and client_secret is not None
    return CurveKeys(server_public, server_secret, client_public, client_secret, keys_dir / "clients")


def secure_server(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    """Make a socket that binds a CURVE server (call before bind)."""
    if keys is None:
        return
    sock.curve_server = True
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public


def secure_client(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    """Make a socket that connects a CURVE client of the cluster's servers (call before connect)."""
    if keys is None:
        return
    sock.curve_serverkey = keys.server_public
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public


class SecureContext:
    """A ZeroMQ context, with a ZAP authenticator checking client keys when CURVE is on."""

    def __init__(self, keys: CurveKeys | None) -> None:
        self.ctx = zmq.asyncio.Context()
        self._auth: AsyncioAuthenticator | None = None
        if keys is not None:
            self._auth = AsyncioAuthenticator(self.ctx)
            self._auth.start()
            self._auth.configure_curve(domain="*", location=str(keys.allowed_clients_dir))

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
        self.ctx.destroy(linger=0)
