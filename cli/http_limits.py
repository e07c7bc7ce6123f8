"""The frontend's HTTP limits as command-line options, defined once: `splitserve frontend` takes them, and `up`
takes the same ones and passes them to every frontend process it starts."""

from __future__ import annotations

from dataclasses import dataclass, fields

import typer

from services.frontend.http_messages import HttpConfig

_DEFAULT = HttpConfig()
_KIB, _MIB = 1024, 1024 * 1024

MaxBodyMib = typer.Option(_DEFAULT.max_body_bytes / _MIB, help="Largest request body accepted (413 beyond, "
                          "decided from Content-Length before reading)")
MaxHeaderKib = typer.Option(_DEFAULT.max_header_bytes / _KIB, help="Largest request line + headers (431 beyond)")
HeaderTimeoutS = typer.Option(_DEFAULT.header_timeout_s, help="Seconds a client has to send a request's headers")
BodyTimeoutS = typer.Option(_DEFAULT.body_timeout_s, help="Seconds a client has to send a request's body")
KeepaliveTimeoutS = typer.Option(_DEFAULT.keepalive_timeout_s,
                                 help="Seconds an idle keep-alive connection stays open")
MaxConnections = typer.Option(_DEFAULT.max_connections, help="Open HTTP connections (per frontend process) "
                              "beyond which new ones get 503")


@dataclass(frozen=True)
class HttpLimits:
    """What an operator sets, in the units of the flags; the field names are the flags' (``--max-body-mib``)."""

    max_body_mib: float = _DEFAULT.max_body_bytes / _MIB
    max_header_kib: float = _DEFAULT.max_header_bytes / _KIB
    header_timeout_s: float = _DEFAULT.header_timeout_s
    body_timeout_s: float = _DEFAULT.body_timeout_s
    keepalive_timeout_s: float = _DEFAULT.keepalive_timeout_s
    max_connections: int = _DEFAULT.max_connections

    def args(self) -> list[str]:
        """The frontend command's flags for these limits (every one, so a frontend's command line shows them)."""
        return [a for f in fields(self) for a in ("--" + f.name.replace("_", "-"), str(getattr(self, f.name)))]

    def http_config(self, host: str, port: int, reuse_port: bool) -> HttpConfig:
        return HttpConfig(host=host, port=port, max_body_bytes=int(self.max_body_mib * _MIB),
                          max_header_bytes=int(self.max_header_kib * _KIB), header_timeout_s=self.header_timeout_s,
                          body_timeout_s=self.body_timeout_s, keepalive_timeout_s=self.keepalive_timeout_s,
                          max_connections=self.max_connections, reuse_port=reuse_port)
