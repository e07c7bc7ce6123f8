"""Several "hosts" on one machine, for multi-host tests and benchmarks (docs/architecture.md#nixl-facts).

A host is a network namespace whose one veth (``eth0``, 198.18.K.<i+1>/24) plugs into a Linux bridge that lives in
a namespace of its own, plus a PID, IPC and mount namespace (with a private ``/dev/shm``) held by a small init
process. Processes on two hosts therefore share no memory and cannot ``process_vm_readv`` each other: UCX between
them has to take the wire, as between machines. The root namespace gets one veth into the bridge (198.18.K.254)
so the test process can reach the hosts; there is no default route and no NAT, so nothing leaves the bridge.

    with hosts(3) as hs:
        proc = hs[1].spawn([...], env, log_path, core=0)
        hs[2].link_down(); hs[2].link_up(); hs[2].kill_all()

Names carry a per-run id (``ss-<uid>-<i>``, bridge ``ss-<uid>-br``, root veth ``ss-<uid>``); ``cleanup_stale()``
(tests/harness/host_runs.py, also ``python -m tests.harness.hosts``) removes what runs that died without tearing down
left behind. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); else
``HostsUnavailable``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.host_runs import (  # noqa: F401 (cleanup_stale, check_available: part of this module's API)
    check_available,
    cleanup_stale,
    delete_run,
    ip,
    kill_quietly,
    reserve_run,
    run_cmd,
    subnet_prefix,
)
from common.errors import HostsError, HostsUnavailable, NetemUnavailable

ROOT_HOST = 254  # the root namespace's address in every subnet
_PR_SET_PDEATHSIG = 1
# PID 1 of a host: reaps orphans, says "ready" once the private /dev/shm is mounted.
_INIT = ("import os, sys, time\nprint('ready', flush=True)\nwhile True:\n"
         "    try:\n        os.wait()\n    except ChildProcessError:\n        time.sleep(1.0)\n")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _child_of(popen: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int:
    """The child ``popen`` (nsenter, unshare) forked into the host; 0 if it already came and went."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if kids := _children(popen.pid):
            return kids[0]
        if popen.poll() is not None:
            return 0
        time.sleep(0.01)
    raise HostsError(f"process {popen.pid} started no child in {timeout_s}s")


def _die_with_parent() -> None:
    # SIGKILL this process when the test process dies, so a killed pytest leaves no host running.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class HostProc:
    """A command running on a host. ``pid`` is its id in the root PID namespace (signal it directly)."""

    popen: subprocess.Popen[bytes]  # the nsenter that started it; exits with it
    pid: int
    log_path: Path | None

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait(self, timeout_s: float | None = None) -> int:
        return self.popen.wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


@dataclass
class Host:
    index: int
    name: str  # its network namespace
    address: str  # on the bridge, e.g. 198.18.7.2
    bridge_ns: str
    port: str  # its veth's end in the bridge namespace
    init: subprocess.Popen[bytes] | None = None  # unshare, parent of the PID namespace's init
    init_pid: int = 0  # PID 1 of the host, in the root PID namespace
    procs: list[HostProc] = field(default_factory=list)

    def ensure_init(self) -> int:
        """PID 1 of the host (started again after kill_all), in the root PID namespace."""
        if self.init is not None and self.init.poll() is None:
            return self.init_pid
        script = f"mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec {sys.executable} -c \"$0\""
        self.init = subprocess.Popen(
            ["ip", "netns", "exec", self.name, "unshare", "--pid", "--ipc", "--mount", "--fork", "--mount-proc",
             "--kill-child", "--", "sh", "-c", script, _INIT],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent)  # noqa: PLW1509 (the hook only calls prctl)
        assert self.init.stdout is not None
        ready, _, _ = select.select([self.init.stdout], [], [], 30.0)
        if not ready or self.init.stdout.readline().strip() != b"ready":
            self.init.kill()
            err = self.init.stderr.read().decode(errors="replace") if self.init.stderr else ""
            raise HostsError(f"host {self.name}: init did not start: {err.strip()[-500:]}")
        self.init_pid = _child_of(self.init)
        if not self.init_pid:
            raise HostsError(f"host {self.name}: init exited at once")
        return self.init_pid

    def command(self, cmd: list[str], core: int | None = None, cwd: str | None = None) -> list[str]:
        """``cmd`` prefixed to run inside this host (its network, PID, IPC and mount namespaces)."""
        pin = ["taskset", "-c", str(core)] if core is not None else []
        return ["nsenter", f"--target={self.ensure_init()}", "--net", "--pid", "--ipc", "--mount",
                f"--wd={cwd or os.getcwd()}", "--", *pin, *cmd]

    def spawn(self, cmd: list[str], env: dict[str, str] | None = None, log_path: Path | None = None,
              core: int | None = None, cwd: str | None = None) -> HostProc:
        """Start ``cmd`` on this host, output to ``log_path`` (appended), pinned to ``core`` if given."""
        full = self.command(cmd, core, cwd)
        with open(log_path or os.devnull, "ab") as log:
            popen = subprocess.Popen(full, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                     stdin=subprocess.DEVNULL)
        proc = HostProc(popen, _child_of(popen), log_path)
        self.procs.append(proc)
        return proc

    def run(self, cmd: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a short command on this host and return its output."""
        return subprocess.run(self.command(cmd), capture_output=True, text=True, timeout=timeout_s, check=False)

    def kill_all(self) -> None:
        """kill -9 every process on this host (SIGKILL to its PID namespace's init takes them all).

        The next spawn starts a new init; call it from a thread that outlives the host's processes (the init
        gets SIGKILL when the thread that started it exits, so a killed test process leaves nothing running).
        """
        if self.init is not None:
            kill_quietly(self.init_pid)
            self.init.communicate()  # waits, and closes its pipes
            self.init = None
        for pid in ip("netns", "pids", self.name, check=False).stdout.split():
            kill_quietly(int(pid))  # anything that joined only the network namespace
        for proc in self.procs:
            proc.popen.wait()
        self.procs.clear()

    def link_bytes(self) -> tuple[int, int]:
        """(received, sent) bytes on the host's link so far: what crossed the wire, not shared memory."""
        stats = json.loads(ip("-j", "-s", "link", "show", "eth0", ns=self.name).stdout)[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def link_down(self) -> None:
        """Unplug the host's cable: its bridge port goes down, its sockets stay (a partition, not a crash)."""
        ip("link", "set", self.port, "down", ns=self.bridge_ns)

    def link_up(self) -> None:
        ip("link", "set", self.port, "up", ns=self.bridge_ns)

    def netem(self, delay_ms: float = 0.0, rate_gbit: float | None = None) -> None:
        """Shape both directions of the host's link: one-way ``delay_ms`` and ``rate_gbit`` each way.

        Needs sch_netem; a kernel without it can still cap the rate (tbf) but not delay: NetemUnavailable.
        """
        shape = ["delay", f"{delay_ms}ms", *(["rate", f"{rate_gbit}gbit"] if rate_gbit else []), "limit", "100000"]
        for ns, dev in ((self.name, "eth0"), (self.bridge_ns, self.port)):
            res = run_cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "netem", *shape], check=False)
            if res.returncode == 0:
                continue
            if "unknown" not in res.stderr or delay_ms > 0 or not rate_gbit:
                raise NetemUnavailable(f"tc netem on {ns}/{dev}: {res.stderr.strip()}")
            # Burst: at least 1 ms of traffic (timer granularity) and several 64 KiB GSO packets.
            burst_bytes = max(int(rate_gbit * 1e9 / 8 * 1e-3), 512 * 1024)
            run_cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_gbit}gbit",
                  "burst", str(burst_bytes), "latency", "20ms"])

    def clear_netem(self) -> None:
        for ns, dev in ((self.name, "eth0"), (self.bridge_ns, self.port)):
            run_cmd(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)


@dataclass
class Hosts:
    uid: str
    subnet: int  # K: host i is 198.(18 + K // 256).(K % 256).(i + 1)
    hosts: list[Host]
    root_address: str  # the root namespace's end, for the test process
    root_link: str

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def close(self) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.kill_all()
        delete_run(self.uid)


def _create(n: int) -> Hosts:
    uid, k = reserve_run(n)
    try:
        return _build(uid, k, n)
    except BaseException:
        delete_run(uid)
        raise


def _build(uid: str, k: int, n: int) -> Hosts:
    bridge_ns, net = f"ss-{uid}-br", subnet_prefix(k)
    res = ip("netns", "add", bridge_ns, check=False)
    if res.returncode != 0:
        raise HostsUnavailable(f"cannot create network namespaces: {res.stderr.strip()}")
    ip("link", "set", "lo", "up", ns=bridge_ns)
    ip("link", "add", "br0", "type", "bridge", ns=bridge_ns)
    ip("link", "set", "br0", "up", ns=bridge_ns)
    hosts = []
    for i in range(n):
        name, port = f"ss-{uid}-{i}", f"h{i}"
        ip("netns", "add", name)
        ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name, ns=bridge_ns)
        ip("link", "set", port, "master", "br0", "up", ns=bridge_ns)
        ip("addr", "add", f"{net}.{i + 1}/24", "dev", "eth0", ns=name)
        ip("link", "set", "eth0", "up", ns=name)
        ip("link", "set", "lo", "up", ns=name)
        hosts.append(Host(i, name, f"{net}.{i + 1}", bridge_ns, port))
    root_link = f"ss-{uid}"
    ip("link", "add", root_link, "type", "veth", "peer", "name", "root", "netns", bridge_ns)
    ip("link", "set", "root", "master", "br0", "up", ns=bridge_ns)
    ip("addr", "add", f"{net}.{ROOT_HOST}/24", "dev", root_link)
    ip("link", "set", root_link, "up")
    for host in hosts:  # now, on the caller's thread: a host's init dies with the thread that started it
        host.ensure_init()
    return Hosts(uid, k, hosts, f"{net}.{ROOT_HOST}", root_link)


@contextlib.contextmanager
def hosts(n: int) -> Iterator[Hosts]:
    """``n`` hosts on one bridge, torn down on exit (also on errors and KeyboardInterrupt)."""
    made = _create(n)
    try:
        yield made
    finally:
        made.close()


if __name__ == "__main__":  # python -m tests.harness.hosts: remove what killed runs left behind
    print("removed runs:", " ".join(cleanup_stale()) or "none")
