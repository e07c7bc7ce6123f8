"""ZeroMQ CURVE on every socket: a keypair per service, and a ZAP check of who may connect.

``splitserve keys make OUT`` writes one directory per service (``OUT/router``, ``OUT/worker``, ``OUT/kvtier``,
``OUT/frontend``, ``OUT/planner``, ``OUT/scaler``), each given to that service's ``--curve-dir``. ``scaler`` is
whoever follows the planner's ScaleRequests from outside its process (``up``'s launcher, ``planner-events``);
the planner's own ``--scaler kubernetes`` subscribes with the planner's key.

- ``<service>.key`` / ``<service>.key_secret``: its own keypair (the secret file 0600; a secret readable by
  others is refused at load);
- ``servers/<kind>.key``: the public keys of the servers it dials (a client must know whom it talks to);
- ``clients/<kind>.key``: the public keys allowed to connect to it. pyzmq's ZAP authenticator (``zmq.auth``)
  checks every handshake against them; a peer whose key is not there never completes it.

Loopback deployments run without CURVE (the default).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from common.errors import SplitserveError

# Who dials whom: each service's servers, and (the reverse) which services each server accepts.
DIALS: dict[str, tuple[str, ...]] = {
    "router": (),
    "worker": ("router", "kvtier"),
    "kvtier": ("router",),
    "frontend": ("router", "worker"),
    # The planner dials its own PUB too: ``--scaler kubernetes`` follows it from inside the planner's process.
    "planner": ("router", "planner"),
    "scaler": ("planner",),
}
SERVICES = tuple(DIALS)


def accepted_clients(server: str) -> tuple[str, ...]:
    return tuple(s for s, dialed in DIALS.items() if server in dialed)


@dataclass(frozen=True, slots=True)
class CurveKeys:
    service: str
    public: bytes
    secret: bytes
    # Public keys of the servers this service dials, by kind (router, worker, kvtier).
    server_keys: dict[str, bytes]
    # Directory of *.key files holding the client public keys this service's servers accept.
    allowed_clients_dir: Path
    # The server a client socket is about to dial (``toward``); empty on a service's own key set.
    server_public: bytes = b""

    def toward(self, server: str) -> CurveKeys:
        """These keys set up to dial a ``server`` (its public key from ``servers/``)."""
        try:
            return replace(self, server_public=self.server_keys[server])
        except KeyError as exc:
            raise SplitserveError(f"{self.service} has no public key of {server} (servers/{server}.key): "
                                  "make the keys with `splitserve keys make`") from exc


def make_curve_keys(out_dir: Path, services: tuple[str, ...] = SERVICES) -> Path:
    """Write a keypair per service and each one's servers/ and clients/ public keys under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / ".public"
    staging.mkdir(exist_ok=True)
    for service in services:
        own = out_dir / service
        own.mkdir(exist_ok=True)
        public, secret = zmq.auth.create_certificates(own, service)
        os.chmod(secret, 0o600)
        (staging / f"{service}.key").write_bytes(Path(public).read_bytes())
    for service in services:
        for kind, names in (("servers", DIALS[service]), ("clients", accepted_clients(service))):
            (out_dir / service / kind).mkdir(exist_ok=True)
            for name in names:
                if name in services:
                    (out_dir / service / kind / f"{name}.key").write_bytes((staging / f"{name}.key").read_bytes())
    for path in staging.iterdir():
        path.unlink()
    staging.rmdir()
    return out_dir


def curve_keys_present(out_dir: Path, services: tuple[str, ...] = SERVICES) -> bool:
    """Whether ``out_dir`` already holds every service's keypair (``keys make --if-absent`` keeps them: a restarted
    deployment's running services hold these keys, new ones would lock them out)."""
    return all(len(list((out_dir / service).glob("*.key_secret"))) == 1 for service in services)


def load_curve_keys(keys_dir: Path) -> CurveKeys:
    """A service's keys from its directory (``OUT/<service>`` of ``keys make``)."""
    secrets = sorted(keys_dir.glob("*.key_secret"))
    if len(secrets) != 1:
        raise SplitserveError(f"{keys_dir} must hold exactly one *.key_secret (this service's), found {len(secrets)}")
    secret_path = secrets[0]
    # Others may not read it, nor the group write it. Group read is allowed: a Kubernetes Secret volume gives its
    # files to the pod's fsGroup (defaultMode 0440), the only way a non-root pod reads a root-owned secret file.
    if secret_path.stat().st_mode & (stat.S_IRWXO | stat.S_IWGRP):
        raise SplitserveError(f"{secret_path} is readable by others: chmod 600 it (0640 at most)")
    try:
        public, secret = zmq.auth.load_certificate(secret_path)
        server_keys = {p.stem: zmq.auth.load_certificate(p)[0] for p in sorted((keys_dir / "servers").glob("*.key"))}
    except (OSError, ValueError) as exc:
        raise SplitserveError(f"CURVE keys in {keys_dir} are missing or broken: {exc}") from exc
    assert secret is not None
    clients = keys_dir / "clients"
    clients.mkdir(exist_ok=True)
    return CurveKeys(secret_path.name.removesuffix(".key_secret"), public, secret, server_keys, clients)


def secure_server(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    """Make a socket that binds a CURVE server with this service's keypair (call before bind)."""
    if keys is None:
        return
    sock.curve_server = True
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public


def secure_client(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    """Make a socket that connects as a CURVE client to the server ``keys`` is set ``toward`` (before connect)."""
    if keys is None:
        return
    if not keys.server_public:
        raise SplitserveError(f"{keys.service}: a client socket needs keys.toward(<server kind>)")
    sock.curve_serverkey = keys.server_public
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public


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


def client_kinds(keys: CurveKeys) -> dict[str, str]:
    """The kind of each client key this service accepts: z85 public key -> ``<kind>`` of ``clients/<kind>.key``.

    ZAP tells a server which key a peer proved (its ``User-Id``); this names the service that key belongs to, so
    the server can grant per kind (a frontend's key may route, not speak for a worker)."""
    kinds: dict[str, str] = {}
    for path in sorted(keys.allowed_clients_dir.glob("*.key")):
        try:
            public, _ = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise SplitserveError(f"client key {path} is broken: {exc}") from exc
        kinds[public.decode("ascii")] = path.stem
    return kinds
