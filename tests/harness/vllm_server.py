"""vLLM's own OpenAI server as a process (the reference a parity test compares splitserve against).

``python -m vllm.entrypoints.openai.api_server`` from this venv (not the ``vllm`` script), pinned to one core with
taskset and VLLM_CPU_OMP_THREADS_BIND, OMP_NUM_THREADS=1, torch's libgomp preloaded, a small KV cache: the
engine settings splitserve's workers run with (services/worker/engines/vllm/config.py), so greedy answers can
be compared token for token.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cli.ports import free_port


@dataclass
class VllmServer:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    socket_dir: str  # its VLLM_RPC_BASE_PATH: vLLM leaves its IPC socket files behind; stop() removes them

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited ({self.proc.returncode}):\n{self.logs()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM's server not ready in {timeout_s}s:\n{self.logs()[-4000:]}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server alone (it stops its engine core, and its resource tracker unlinks the semaphores it
        made: a signal to the whole group killed the tracker too and left them in /dev/shm); SIGKILL what is left
        of its group after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 5.0  # its children exit after it
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
                return
            time.sleep(0.1)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def _inductor_cache_dir() -> str:
    """torch's default compile cache, as under the TMPDIR we were started with."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")


def start_vllm_server(log_dir: Path, model_dir: Path, *args: str, core: int, served_name: str,
                      env: dict[str, str] | None = None) -> VllmServer:
    """Starts it and returns at once (``wait_ready`` waits): another server can start meanwhile. ``env`` adds to
    (and wins over) the environment above, e.g. a NIXL side-channel port per engine for P/D."""
    port = free_port()
    socket_dir = tempfile.mkdtemp(prefix="splitserve-vllm-server-")
    # TMPDIR too: vLLM's torch.distributed FileStore ($TMPDIR/vllm_dist_<uuid>) outlives a killed server, and stop()
    # removes this directory (torch's compile cache keeps its usual place).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": str(core), "VLLM_RPC_BASE_PATH": socket_dir, "TMPDIR": socket_dir,
           "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR") or _inductor_cache_dir(), **(env or {})}
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin and (libgomp := Path(spec.origin).parent / "lib" / "libgomp.so.1").exists():
        env["LD_PRELOAD"] = str(libgomp)
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model_dir), "--served-model-name", served_name, "--dtype", "float32", "--block-size", "32",
           "--enforce-eager", "--host", "127.0.0.1", "--port", str(port), *args]
    log_path = Path(log_dir) / f"vllm-server-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return VllmServer(proc, f"http://127.0.0.1:{port}", log_path, socket_dir)
