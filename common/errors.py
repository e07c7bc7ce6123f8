"""Errors shared by every service. Each carries enough to be logged or turned into an HTTP reply."""


class SplitserveError(Exception):
    """Base of every error this project raises on purpose."""


class ProtocolError(SplitserveError):
    """A message that is not a known, well-formed wire message."""


class TransportTimeout(SplitserveError):
    """A request got no reply within its timeout."""


class RemoteError(SplitserveError):
    """The peer answered with an ErrorReply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class NoWorkerError(SplitserveError):
    """No registered worker can take the request."""


class RegistrationRefused(SplitserveError):
    """The router refused a worker's registration (broken contract: block size, hash seed)."""


class ModelError(SplitserveError):
    """A model directory that is missing or broken."""


class EngineError(SplitserveError):
    """The engine failed a request or could not start."""


class WorkerLost(SplitserveError):
    """A worker stopped answering while it held a request."""


class NixlUnavailable(SplitserveError):
    """No NIXL agent could be made (not installed, or no backend works)."""


class AddressError(SplitserveError, ValueError):
    """A bind or advertised address peers could not use (a wildcard advertised, an endpoint that cannot be parsed)."""


class HostsError(SplitserveError):
    """A namespaced test host (tests/harness/hosts.py) could not be set up or driven."""


class HostsUnavailable(HostsError):
    """This machine cannot make namespaced hosts (no CAP_NET_ADMIN/CAP_SYS_ADMIN, or `ip`/`unshare` missing)."""


class NetemUnavailable(HostsError):
    """The kernel has no sch_netem: a test host's link can be rate-capped (tbf) but not delayed."""
