"""multiprocessing's resource tracker for a worker's engine tree, that survives the tree and leaves a record.

vLLM's engine processes make named POSIX semaphores (``/dev/shm/sem.mp-*``: ``multiprocessing`` Locks and Queues
of its spawn context) and shared-memory segments (``psm_*``). multiprocessing registers each name with one
resource-tracker process per tree (spawned children inherit its pipe), which unlinks what is still registered
when every holder of the pipe is gone. That tracker is a plain child of the worker: a SIGKILL of the worker's
process group (``up`` sends one after a worker exits, and its engine reaper kills every descendant) takes it
with the tree before it unlinks, and the names stay in /dev/shm for good: a name alone does not say whose it was.

``start_shm_tracker()`` installs this module's tracker in the worker before any engine process exists: the same
pipe protocol (``REGISTER|UNREGISTER|PROBE:name:rtype``), in a session of its own (a group signal misses it), that
ignores SIGINT and SIGTERM, and that appends every REGISTER and UNREGISTER to ``<run dir>/<its pid>.names``
before acting on it. At EOF it unlinks what is still registered and removes its record. If it is killed anyway
(SIGKILL, the OOM killer), the record says what it held: ``sweep_stale_records()`` (the launcher at start and
after a worker exits, a worker at its start) unlinks, for each record whose tracker is dead, every name still
registered that no live process maps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

MARK = "cli.shm_tracker"  # in the tracker's command line: how a record's pid is told from a reused one
# /dev/shm file of each resource kind multiprocessing tracks, by its registered name ("/mp-abc", "/psm_abc").
SHM_FILE = {"semaphore": "/dev/shm/sem.{}", "shared_memory": "/dev/shm/{}"}


def run_dir() -> Path:
    """This user's directory of tracker records (0700)."""
    path = Path(tempfile.gettempdir()) / f"splitserve-shm-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def start_shm_tracker(records: Path | None = None) -> int:
    """Start the tracker and make it this process's (and its spawned children's) resource tracker; its pid."""
    from multiprocessing import resource_tracker

    records = records or run_dir()
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", f"from {MARK} import main; main({read_fd}, {str(records)!r})"],
                            pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)
    os.close(read_fd)
    _held.append(proc)  # never waited for: it outlives this process
    tracker = resource_tracker._resource_tracker
    with tracker._lock:
        if tracker._fd is not None:  # one started earlier: ours replaces it for everything registered from now
            os.close(tracker._fd)
        tracker._fd, tracker._pid = write_fd, proc.pid
    return proc.pid


_held: list[subprocess.Popen] = []


def shm_path(rtype: str, name: str) -> str | None:
    pattern = SHM_FILE.get(rtype)
    return pattern.format(name.lstrip("/")) if pattern else None


def replay(lines: list[str]) -> dict[str, str]:
    """The names a record still holds: {name: rtype} after its REGISTER (+) and UNREGISTER (-) lines."""
    held: dict[str, str] = {}
    for line in lines:
        sign, _, rest = line.strip().partition(" ")
        rtype, _, name = rest.partition(":")
        if sign == "+" and name:
            held[name] = rtype
        elif sign == "-":
            held.pop(name, None)
    return held


def _tracker_alive(pid: int) -> bool:
    try:
        return MARK in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def sweep_stale_records(records: Path | None = None) -> list[str]:
    """Unlink what dead trackers held and no live process maps; the files removed."""
    from cli.engine_reaper import remove_orphaned_segments

    records = records or run_dir()
    removed: list[str] = []
    for record in sorted(records.glob("*.names")):
        try:
            pid = int(record.stem)
        except ValueError:
            continue
        if _tracker_alive(pid):
            continue
        held = replay(record.read_text(errors="replace").splitlines())
        paths = {p for name, rtype in held.items() if (p := shm_path(rtype, name))}
        removed += remove_orphaned_segments({p for p in paths if os.path.exists(p)})
        # A name a live process still maps (an engine process the reaper has not killed yet) keeps the record
        # for a later sweep: dropped now, nothing would know the name once that process is gone.
        if not any(os.path.exists(p) for p in paths):
            record.unlink(missing_ok=True)
    return removed


def main(fd: int, records: str) -> None:
    """The tracker process: multiprocessing's protocol on ``fd``, every change recorded first."""
    from multiprocessing.resource_tracker import _CLEANUP_FUNCS

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record = Path(records) / f"{os.getpid()}.names"
    held: dict[str, str] = {}
    with open(fd, "rb") as pipe, open(record, "a", encoding="ascii") as out:
        for line in pipe:
            try:
                cmd, name, rtype = line.strip().decode("ascii").split(":")
            except ValueError:
                continue  # not the protocol: nothing to track
            if cmd == "REGISTER" and rtype in _CLEANUP_FUNCS:
                out.write(f"+ {rtype}:{name}\n")
                out.flush()  # on disk before the name is used: a SIGKILL from here on leaves it in the record
                held[name] = rtype
            elif cmd == "UNREGISTER":
                out.write(f"- {rtype}:{name}\n")
                out.flush()
                held.pop(name, None)
    for name, rtype in held.items():  # every holder of the pipe is gone: what is left leaked
        try:
            _CLEANUP_FUNCS[rtype](name)
        except OSError:
            pass  # unlinked by someone else already
    record.unlink(missing_ok=True)
