"""A worker killed -9 takes its engine processes with it (cli/engine_reaper.py): real processes, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.harness.graph import wait_until

SEGMENT = f"splitserve-reaper-test-{os.getpid()}"
# The "worker": starts the reaper, then an "engine core" child (and its own child) that maps a shared-memory
# segment as vLLM's message queues do, prints their pids, waits.
WORKER = textwrap.dedent(f"""
    import subprocess, sys, time
    from cli.engine_reaper import private_socket_dir, start_engine_reaper
    sockets = private_socket_dir("decode/1")
    reaper = start_engine_reaper(poll_s=0.1, remove_dirs=(sockets,))
    core = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys, time, mmap, os, socket; subprocess.Popen([sys.executable, '-c', "
                             "'import time; time.sleep(600)']); "
                             "fd = os.open('/dev/shm/{SEGMENT}', os.O_CREAT | os.O_RDWR, 0o600); "
                             "os.ftruncate(fd, 4096); m = mmap.mmap(fd, 4096); "
                             "s = socket.socket(socket.AF_UNIX); s.bind(os.environ['VLLM_RPC_BASE_PATH'] + '/ipc'); "
                             "time.sleep(600)"])
    time.sleep(0.5)  # the reaper notes both
    print(reaper, core.pid, sockets, flush=True)
    time.sleep(600)
""")


def _start_worker(new_session: bool = False) -> tuple[subprocess.Popen[str], int, list[psutil.Process]]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"}
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True,
                              env={**env, "PYTHONPATH": os.getcwd()}, start_new_session=new_session)
    reaper_pid, core_pid, sockets = worker.stdout.readline().split()
    core = psutil.Process(int(core_pid))
    assert wait_until(lambda: len(core.children()) == 1, timeout_s=10)
    assert os.path.exists(sockets + "/ipc") and "decode_1" in sockets
    _socket_dirs[worker.pid] = sockets
    return worker, int(reaper_pid), [core, *core.children()]


_socket_dirs: dict[int, str] = {}  # worker pid -> its private_socket_dir


def _gone(procs: list[psutil.Process]) -> bool:
    return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in procs)


def test_sigkilled_worker_takes_its_engine_processes_their_shared_memory_and_socket_files_with_it() -> None:
    worker, reaper_pid, engine = _start_worker()
    assert os.path.exists(f"/dev/shm/{SEGMENT}")
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    assert wait_until(lambda: _gone(engine), timeout_s=10), [p.pid for p in engine if p.is_running()]
    assert wait_until(lambda: not os.path.exists(f"/dev/shm/{SEGMENT}"), timeout_s=10)
    assert wait_until(lambda: not os.path.exists(_socket_dirs[worker.pid]), timeout_s=10)  # vLLM's socket files
    assert wait_until(lambda: not psutil.pid_exists(reaper_pid) or
                      psutil.Process(reaper_pid).status() == psutil.STATUS_ZOMBIE, timeout_s=10)


def test_the_reaper_outlives_a_sigterm_and_acts_only_when_the_worker_is_gone() -> None:
    worker, reaper_pid, engine = _start_worker()
    try:
        os.kill(reaper_pid, signal.SIGTERM)  # a graceful stop signalled to the whole group reaches it too
        time.sleep(0.3)
        assert psutil.Process(reaper_pid).is_running() and all(p.is_running() for p in engine)
    finally:
        worker.kill()
        worker.wait(10)
    assert wait_until(lambda: _gone(engine), timeout_s=10)


def test_a_segment_another_live_process_maps_is_left_alone(tmp_path) -> None:
    import mmap

    from cli.engine_reaper import remove_orphaned_segments, shm_mapped_by

    path = f"/dev/shm/{SEGMENT}-shared"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        mapped = mmap.mmap(fd, 4096)
        assert path in shm_mapped_by(os.getpid())
        assert remove_orphaned_segments({path}) == [] and os.path.exists(path)  # we still map it
        mapped.close()
        assert remove_orphaned_segments({path}) == [path] and not os.path.exists(path)
    finally:
        os.close(fd)
        if os.path.exists(path):
            os.unlink(path)


def test_a_supervisor_killing_the_dead_workers_group_does_not_stop_the_cleanup() -> None:
    # `up` SIGKILLs a dead worker's process group: the reaper, in a group of its own, still cleans up.
    worker, reaper_pid, engine = _start_worker(new_session=True)  # a group leader, as `up` starts workers
    assert os.getpgid(reaper_pid) == reaper_pid and os.getpgid(engine[0].pid) == worker.pid
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    os.killpg(worker.pid, signal.SIGKILL)  # the engine processes go with the group; the reaper is not in it
    assert wait_until(lambda: _gone(engine), timeout_s=10)
    assert wait_until(lambda: not os.path.exists(f"/dev/shm/{SEGMENT}"), timeout_s=10)


def test_descendants_lists_the_tree_psutil_lists_children_of_threads_included() -> None:
    # A process whose grandchild is started from a second thread: the kernel lists it under that thread.
    from cli.engine_reaper import descendants

    code = ("import subprocess, sys, threading, time; "
            "kids = []; t = threading.Thread(target=lambda: kids.append(subprocess.Popen([sys.executable, '-c', "
            "'import subprocess, sys, time; subprocess.Popen([sys.executable, \"-c\", \"import time; "
            "time.sleep(60)\"]); time.sleep(60)']))); t.start(); t.join(); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    top = subprocess.Popen([sys.executable, "-c", code])
    try:
        proc = psutil.Process(top.pid)
        assert wait_until(lambda: len(proc.children(recursive=True)) == 3, timeout_s=10)
        assert descendants(top.pid, psutil) == {p.pid for p in proc.children(recursive=True)}
    finally:
        for p in psutil.Process(top.pid).children(recursive=True):
            p.kill()
        top.kill()
        top.wait(10)
    with pytest.raises(psutil.NoSuchProcess):
        descendants(top.pid, psutil)
