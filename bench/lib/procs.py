"""The processes of a benchmark from /proc: a process's children and tree, CPU seconds (a process, its threads,
its tree) and resident memory."""

from __future__ import annotations

import os
import resource
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")  # /proc stat times are in these ticks


def _ppid(pid_dir: Path) -> int:
    return int((pid_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])


def _cmdline(pid_dir: Path) -> list[str]:
    return (pid_dir / "cmdline").read_bytes().decode(errors="replace").split("\0")


def children(pid: int) -> dict[int, list[str]]:
    """Direct children of ``pid`` with their command lines (from /proc)."""
    out: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if _ppid(entry) == pid:
                    out[int(entry.name)] = _cmdline(entry)
            except (OSError, IndexError, ValueError):
                continue
    return out


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every descendant (from /proc)."""
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                kids.setdefault(_ppid(entry), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def self_cpu_s() -> float:
    """This process's user+sys CPU seconds."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _utime_stime(stat: bytes) -> tuple[float, float]:
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def proc_cpu_s(pid: int) -> float:
    """utime+stime of a whole process (all threads), seconds."""
    return sum(_utime_stime(Path(f"/proc/{pid}/stat").read_bytes()))


def thread_cpu_s(pid: int) -> dict[str, float]:
    """utime and stime per thread name (threads of one name summed): main thread vs ZeroMQ I/O threads."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_bytes()
        except OSError:
            continue
        name = "main" if task.name == str(pid) else stat[stat.find(b"(") + 1:stat.rfind(b")")].decode(errors="replace")
        user, sys_ = _utime_stime(stat)
        out[name + ".user"] = out.get(name + ".user", 0.0) + user
        out[name + ".sys"] = out.get(name + ".sys", 0.0) + sys_
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants that are alive now."""
    total = 0.0
    for p in tree_pids(pid):
        try:
            total += proc_cpu_s(p)
        except OSError:
            pass
    return total


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` onto ``cores`` (threads it starts later inherit them); gone threads skipped."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except (ProcessLookupError, OSError):
            continue
