"""Bookkeeping of namespaced-host runs (tests/harness/hosts.py): names, subnets, and removal of what dead runs left.

Each live run has ``STATE_DIR/<uid>.json`` (owner pid, subnet index) written under a file lock, so parallel runs
get distinct names and /24s; a run whose owner died is stale and ``cleanup_stale()`` deletes its namespaces and
root veth. Only names of the form ``ss-<6 hex>[-br|-<i>]`` are ever touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
from pathlib import Path

from common.errors import HostsError, HostsUnavailable

NAME_RE = re.compile(r"^ss-([0-9a-f]{6})(?:-(br|\d+))?$")
STATE_DIR = Path("/tmp/splitserve-hosts")  # one <uid>.json per live run: owner pid and subnet index
NUM_SUBNETS = 512  # /24s in 198.18.0.0/15
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21


def run_cmd(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise HostsError(f"{' '.join(args)}: {res.stderr.strip() or res.returncode}")
    return res


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_cmd(["ip", *(["-n", ns] if ns else []), *args], check)


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def check_available() -> None:
    """Raise HostsUnavailable (one line) where namespaced hosts cannot be made."""
    missing = [tool for tool in ("ip", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        raise HostsUnavailable(f"multi-host harness needs {', '.join(missing)} (iproute2/util-linux)")
    cap_eff = int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                       if line.startswith("CapEff:")).split()[1], 16)
    for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN")):
        if not cap_eff >> bit & 1:
            raise HostsUnavailable(f"multi-host harness needs {name} (run as root)")


def subnet_prefix(k: int) -> str:
    return f"198.{18 + k // 256}.{k % 256}"


def owner_alive(uid: str) -> bool:
    try:
        pid = json.loads((STATE_DIR / f"{uid}.json").read_text())["pid"]
        os.kill(pid, 0)
        return True
    except (OSError, ValueError, KeyError):
        return False


def delete_run(uid: str) -> None:
    names = [n for n in netns_names() if NAME_RE.match(n) and NAME_RE.match(n).group(1) == uid]
    for name in names:
        for pid in ip("netns", "pids", name, check=False).stdout.split():
            kill_quietly(int(pid))
    for name in names:
        ip("netns", "del", name, check=False)
    ip("link", "del", f"ss-{uid}", check=False)
    (STATE_DIR / f"{uid}.json").unlink(missing_ok=True)


def netns_names() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines() if line.strip()]


def cleanup_stale() -> list[str]:
    """Delete hosts (namespaces, root veths) of runs whose owner process is gone; returns their uids."""
    uids = {m.group(1) for n in netns_names() if (m := NAME_RE.match(n))}
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        if (m := NAME_RE.match(line.split(":")[1].strip().split("@")[0])) and m.group(2) is None:
            uids.add(m.group(1))
    stale = sorted(uid for uid in uids if not owner_alive(uid))
    for uid in stale:
        delete_run(uid)
    return stale


def _pick_subnet() -> int:
    used = set()
    for state in STATE_DIR.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            used.add(json.loads(state.read_text())["subnet"])
    ours = ipaddress.ip_network("198.18.0.0/15")
    for line in ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        addr = ipaddress.ip_interface(line.split()[3])
        if addr.ip in ours:
            used.add((int(addr.ip) - int(ours.network_address)) // 256)
    free = [k for k in range(NUM_SUBNETS) if k not in used]
    if not free:
        raise HostsError("no free /24 left in 198.18.0.0/15")
    return random.choice(free)


def reserve_run(num_hosts: int) -> tuple[str, int]:
    """A fresh run id and a /24 no live run (nor the root namespace) uses; stale runs removed first."""
    check_available()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    uid = f"{random.getrandbits(24):06x}"
    with open(STATE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cleanup_stale()
        k = _pick_subnet()
        state = {"pid": os.getpid(), "subnet": k, "num_hosts": num_hosts}
        (STATE_DIR / f"{uid}.json").write_text(json.dumps(state))
    return uid, k
