"""The namespaced hosts themselves: reachable over the bridge only, isolated like machines, always torn down."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.graph import wait_until
from tests.harness.host_runs import NAME_RE, cleanup_stale, subnet_prefix
from tests.harness.hosts import hosts
from common.errors import NetemUnavailable

pytestmark = pytest.mark.multihost

LISTEN = ("import socket, sys\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind((sys.argv[1], 7000)); s.listen(16); print('listening', flush=True)\n"
          "while True:\n    c, _ = s.accept(); c.sendall(b'hello'); c.close()\n")
CONNECT = ("import socket, sys\ns = socket.socket(); s.settimeout(1.0)\n"
           "rc = s.connect_ex((sys.argv[1], int(sys.argv[2])))\nprint(rc, s.recv(5).decode() if rc == 0 else '')\n")


@pytest.mark.parametrize(("k", "prefix"),
                         [(0, "198.18.0"), (255, "198.18.255"), (256, "198.19.0"), (511, "198.19.255")])
def test_subnets_stay_in_the_benchmark_range(k: int, prefix: str) -> None:
    assert subnet_prefix(k) == prefix


@pytest.mark.parametrize(("name", "ours"), [("ss-0a1b2c-br", True), ("ss-0a1b2c-3", True), ("ss-0a1b2c", True),
                                            ("ssb-b", False), ("ss-0a1b2c-x", False), ("ss-ZZZZZZ-1", False)])
def test_only_our_names_count_as_stale_candidates(name: str, ours: bool) -> None:
    assert bool(NAME_RE.match(name)) is ours


def _listen(host, tmp_path: Path):
    proc = host.spawn([sys.executable, "-c", LISTEN, host.address], log_path=tmp_path / f"listen-{host.index}.log")
    assert wait_until(lambda: "listening" in proc.logs(), timeout_s=10)
    return proc


def _connect(host, address: str, port: int = 7000) -> str:
    return host.run([sys.executable, "-c", CONNECT, address, str(port)]).stdout.strip()


def test_hosts_reach_each_other_and_the_test_process_but_nothing_outside(make_hosts, tmp_path: Path) -> None:
    hs = make_hosts(2)
    _listen(hs[0], tmp_path)
    assert _connect(hs[1], hs[0].address) == "0 hello"
    with socket.create_connection((hs[0].address, 7000), timeout=2) as conn:  # from the root namespace
        assert conn.recv(5) == b"hello"
    assert "default" not in hs[1].run(["ip", "route"]).stdout
    assert _connect(hs[1], "192.0.2.1", 80).split()[0] == str(errno.ENETUNREACH)  # no route out


def test_hosts_share_no_pid_ipc_mount_or_network_namespace(make_hosts) -> None:
    hs = make_hosts(2)
    kinds = ("pid", "ipc", "mnt", "net")
    show = f"import os; print(' '.join(os.readlink('/proc/self/ns/' + k) for k in {kinds!r}))"
    seen = [hs[i].run([sys.executable, "-c", show]).stdout.split() for i in range(2)]
    mine = [os.readlink(f"/proc/self/ns/{k}") for k in kinds]
    for i, kind in enumerate(kinds):
        assert len({seen[0][i], seen[1][i], mine[i]}) == 3, kind
    # Shared memory: each host has its own /dev/shm; process ids: a host sees only its own processes, so
    # process_vm_readv (which takes a pid) cannot reach another host.
    hs[0].spawn(["sleep", "4242"])
    assert hs[0].run(["sh", "-c", "echo x > /dev/shm/ss-probe && pgrep -f 'slee[p] 4242'"]).returncode == 0
    assert hs[1].run(["sh", "-c", "test -e /dev/shm/ss-probe || pgrep -f 'slee[p] 4242'"]).returncode == 1
    assert not Path("/dev/shm/ss-probe").exists()


def test_kill_all_kills_every_process_on_the_host_and_the_host_takes_new_ones(make_hosts) -> None:
    hs = make_hosts(2)
    procs = [hs[0].spawn(["sh", "-c", "sleep 1000 & sleep 1000"]), hs[0].spawn(["sleep", "1000"])]
    other = hs[1].spawn(["sleep", "1000"])
    hs[0].kill_all()
    assert all(p.poll() is not None for p in procs)
    assert subprocess.run(["ip", "netns", "pids", hs[0].name], capture_output=True, text=True, check=False).stdout == ""
    assert other.poll() is None  # another host is untouched
    again = hs[0].spawn(["sleep", "1000"])
    assert again.poll() is None and Path(f"/proc/{again.pid}").exists()


def test_link_down_partitions_the_host_and_link_up_heals_it(make_hosts, tmp_path: Path) -> None:
    hs = make_hosts(2)
    server = _listen(hs[0], tmp_path)
    hs[0].link_down()
    assert _connect(hs[1], hs[0].address).split()[0] in (str(errno.EAGAIN), str(errno.ETIMEDOUT))
    assert server.poll() is None  # a partition, not a crash
    hs[0].link_up()
    assert wait_until(lambda: _connect(hs[1], hs[0].address) == "0 hello", timeout_s=10)


def test_netem_shapes_the_link_or_says_why_not(make_hosts) -> None:
    hs = make_hosts(1)
    hs[0].netem(rate_gbit=10)  # a rate cap works with or without sch_netem (tbf)
    assert any(kind in hs[0].run(["tc", "qdisc", "show", "dev", "eth0"]).stdout for kind in ("netem", "tbf"))
    try:
        hs[0].netem(delay_ms=0.2, rate_gbit=10)
    except NetemUnavailable as exc:
        assert "netem" in str(exc)
    else:
        assert "delay" in hs[0].run(["tc", "qdisc", "show", "dev", "eth0"]).stdout
    hs[0].clear_netem()
    assert "netem" not in hs[0].run(["tc", "qdisc", "show", "dev", "eth0"]).stdout


def _our_netns(uid: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"ss-{uid}")]


def test_teardown_on_error_leaves_no_namespace_link_or_process(make_hosts) -> None:
    make_hosts(0)  # skips here where namespaces cannot be made
    with pytest.raises(RuntimeError, match="boom"), hosts(2) as hs:
        uid, sleeper = hs.uid, hs[1].spawn(["sleep", "1000"])
        assert len(_our_netns(uid)) == 3
        raise RuntimeError("boom")
    assert _our_netns(uid) == []
    assert subprocess.run(["ip", "link", "show", f"ss-{uid}"], capture_output=True, check=False).returncode != 0
    assert sleeper.poll() is not None


def test_a_killed_run_leaves_no_process_and_its_namespaces_are_cleaned_up(make_hosts) -> None:
    make_hosts(0)
    script = ("from tests.harness.hosts import hosts\nimport time\nwith hosts(1) as hs:\n"
              "    p = hs[0].spawn(['sleep', '1000'])\n    print(hs.uid, p.pid, flush=True)\n    time.sleep(1000)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert owner.stdout is not None
        uid, pid = owner.stdout.readline().split()
    finally:
        owner.send_signal(signal.SIGKILL)  # no teardown runs
        owner.communicate()
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout_s=5)  # died with its owner
    assert len(_our_netns(uid)) == 2
    time.sleep(0.1)
    assert uid in cleanup_stale()
    assert _our_netns(uid) == []
