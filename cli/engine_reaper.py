"""A worker's engine processes die with it, however it dies.

vLLM runs its engine core (and, on CPU, a model worker) as child processes of the worker. When the worker exits
normally it stops them; when it is killed (SIGKILL, the kernel's OOM killer) they live on as orphans: holding
their memory (GPU memory on a GPU host) and the NIXL side-channel port, so the restarted worker on that host
fails with "Address already in use" and the host serves nothing until someone kills them by hand.

``start_engine_reaper()`` forks a small watcher before any engine process exists. It notes the worker's
descendants every ``poll_s`` and waits on a pipe only the worker holds; when the worker is gone (EOF), it
SIGKILLs every noted process still alive (the same process: pid and start time), removes the shared-memory
segments the tree had mapped (vLLM's message queues, multiprocessing's semaphores) that no live process maps any
more, removes the directories it was given (``private_socket_dir``: vLLM's IPC socket files), and exits. It ignores SIGINT
and SIGTERM (a graceful stop is the worker's to do), and the pipe is not inherited by the engine's processes, so
only the worker's own death closes it.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import tempfile
import time

from cli.shm_tracker import MARK as SHM_TRACKER_MARK

POLL_S = 1.0
MAPS_MAX_INTERVAL_S = 30.0


def private_socket_dir(worker_id: str) -> str:
    """A directory of this worker's own for its engine's socket files (our KV events socket, and vLLM's IPC
    sockets through VLLM_RPC_BASE_PATH unless the environment names a place). vLLM makes five
    ``ipc://$TMPDIR/<uuid>`` sockets an engine (three in the worker, two in its engine core) and removes none of
    them: ~1,500 socket files in /tmp after one test suite. The reaper removes the directory once the tree is
    gone, however it went. Short (a socket's path must fit 107 bytes): the worker id's first 16 characters. It is
    also the tree's TMPDIR."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in worker_id)[:16]
    path = tempfile.mkdtemp(prefix=f"splitserve-vllm-{safe}-")
    if not os.environ.get("VLLM_RPC_BASE_PATH"):
        os.environ["VLLM_RPC_BASE_PATH"] = path  # read by vLLM here and in the engine processes it spawns
    # vLLM's executor makes its torch.distributed FileStore at $TMPDIR/vllm_dist_<uuid> and removes it only when the
    # engine stops cleanly: one file left per killed engine (16 after one test suite). The tree's temporary files go
    # here too (this directory is under the TMPDIR it was in); torch's compile cache keeps its usual place.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"))
    os.environ["TMPDIR"] = tempfile.tempdir = path  # spawned processes read the variable, forked ones inherit this
    return path


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's): torch's own fallback
        return "unknown"


def start_engine_reaper(poll_s: float = POLL_S, remove_dirs: tuple[str, ...] = ()) -> int:
    """Fork the watcher of this process's descendants; its pid. Call before the engine starts threads.
    ``remove_dirs``: removed, with what is in them, after the tree is gone."""
    import psutil  # imported here, not in the forked child: a child of a threaded parent should import nothing

    try:
        from setproctitle import setproctitle  # vLLM's dependency: `ps` tells the reaper from the worker
    except ImportError:
        setproctitle = None

    read_fd, write_fd = os.pipe()  # non-inheritable: vLLM's spawned processes do not hold the write end
    watched = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(write_fd)
        if setproctitle is not None:
            setproctitle(f"splitserve-engine-reaper (worker {watched})")
        try:
            _watch(psutil, watched, read_fd, poll_s)
            for path in remove_dirs:
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os._exit(0)
    os.close(read_fd)
    # Held open until this process ends: its death, and only that, closes the pipe.
    _held_fds.append(write_fd)
    return pid


_held_fds: list[int] = []


def _watch(psutil, watched: int, read_fd: int, poll_s: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A process group of our own: a supervisor that SIGKILLs the dead worker's group (`up` does) must not take
    # us with it before the shared memory is cleaned up.
    os.setpgid(0, 0)
    me = os.getpid()
    known: dict[int, float] = {}  # pid -> create time (a reused pid is another process: left alone)
    skipped: set[int] = {me}  # descendants that are not the engine's (this reaper, the shm tracker)
    segments: set[str] = set()  # /dev/shm files the tree mapped
    # Reading every process's maps costs ~10 ms a poll beside a vLLM engine (5,700 lines): on the engine's own
    # core, once a second, that was 1% of a decode engine's time, in 10 ms bursts. The maps are read when the
    # tree changes, then at doubling intervals up to MAPS_MAX_INTERVAL_S (segments are made at start-up); live
    # children are read once more before they are killed.
    maps_interval_s, next_maps_s = poll_s, 0.0
    try:
        parent = psutil.Process(watched)
    except psutil.Error:
        return
    while True:
        readable, _, _ = select.select([read_fd], [], [], poll_s)
        if readable or not parent.is_running():  # EOF: the worker is gone (or a forked child holds the pipe)
            break
        try:
            pids = descendants(watched, psutil)
            for pid in pids - known.keys() - skipped:
                child = psutil.Process(pid)
                if _is_shm_tracker(child):
                    skipped.add(pid)
                else:
                    known[pid] = child.create_time()
                    maps_interval_s, next_maps_s = poll_s, 0.0  # a new process: its maps now
        except psutil.NoSuchProcess:
            continue  # a child that ended between the listing and its reading: next poll
        except psutil.Error:
            break
        now = time.monotonic()
        if now >= next_maps_s:
            for pid in (watched, *known):
                segments |= shm_mapped_by(pid)
            next_maps_s, maps_interval_s = now + maps_interval_s, min(maps_interval_s * 2, MAPS_MAX_INTERVAL_S)
    killed = []
    for child_pid, created in known.items():
        try:
            child = psutil.Process(child_pid)
            if child.create_time() == created:
                segments |= shm_mapped_by(child_pid)
                child.kill()
                killed.append(child)
        except psutil.Error:
            continue  # gone already: the worker stopped it
    psutil.wait_procs(killed, timeout=10)
    remove_orphaned_segments(segments)


def descendants(root: int, psutil) -> set[int]:
    """Every descendant of ``root``, from the kernel's per-thread children lists (a few small files; psutil's
    ``children(recursive=True)`` reads every process's stat on the machine), else from psutil."""
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            if pid == root:
                raise psutil.NoSuchProcess(root) from None
            continue  # ended since its parent listed it
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                    kids = f.read().split()
            except FileNotFoundError:
                if os.path.exists(f"/proc/{pid}/task/{task}"):  # a kernel without CONFIG_PROC_CHILDREN
                    return {p.pid for p in psutil.Process(root).children(recursive=True)}
                continue  # that thread ended
            for kid in map(int, kids):
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def _is_shm_tracker(child) -> bool:
    """cli/shm_tracker.py's tracker: left to exit by itself once the tree is gone (it unlinks what the tree
    registered and never unlinked; killed, it could not)."""
    try:
        return any(SHM_TRACKER_MARK in arg for arg in child.cmdline())
    except Exception:  # psutil.Error: gone already
        return False


SHM_DIR = "/dev/shm/"


def shm_mapped_by(pid: int | str) -> set[str]:
    """The /dev/shm files ``pid`` maps now (from /proc/PID/maps; unlinked ones, "(deleted)", left out)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return {line.split(None, 5)[5].strip() for line in maps
                    if SHM_DIR in line and not line.rstrip().endswith("(deleted)")
                    and line.split(None, 5)[5].startswith(SHM_DIR)}
    except (OSError, IndexError):
        return set()


def shm_inodes_mapped(pid: int | str) -> set[int]:
    """Inodes of the /dev/shm files ``pid`` maps, unlinked ones included: glibc's sem_open creates a semaphore
    as a temporary file, maps it, links it under its name and unlinks the temporary one, so its creator's map
    shows "/dev/shm/sem.XXXXXX (deleted)" with the named file's inode, never the name."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return {int(fields[4]) for line in maps
                    if len(fields := line.split(None, 5)) == 6 and fields[5].startswith(SHM_DIR)}
    except (OSError, ValueError):
        return set()


def remove_orphaned_segments(segments: set[str]) -> list[str]:
    """Unlink each of ``segments`` that no live process maps (another process may share one: it stays); the
    removed ones. Mapped is told by inode, not path (see ``shm_inodes_mapped``)."""
    if not segments:
        return []
    inodes: dict[str, int] = {}
    for path in segments:
        try:
            inodes[path] = os.stat(path).st_ino
        except OSError:
            continue  # gone already
    in_use: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            in_use |= shm_inodes_mapped(entry)
    removed = []
    for path in sorted(p for p, ino in inodes.items() if ino not in in_use):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue  # gone already (its owner unlinked it), or not ours to remove
    return removed
