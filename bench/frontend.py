"""Frontend benchmark: request rate and CPU per request of the OpenAI frontend on a real local graph.

Starts ``splitserve up --engine mock --mock-speedup inf --aggregated 2`` (router, 2 zero-delay mock workers,
frontend; each its own process), then drives streaming chat completions with the raw keep-alive client in
bench/loadgen.py and reads each process's CPU (utime+stime from /proc/<pid>/stat) before and after.

  A (short): one-line user message, max_tokens 16, ignore_eos, 2,000 requests at concurrency 64.
  B (long):  the same with a user message that tokenizes to ~2,000 prompt tokens (exact count from usage).

Writes bench/results/frontend.json (results + conditions) and prints a summary.

    python bench/frontend.py [--requests 2000] [--concurrency 64] [--workloads short,long] [--client-core 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.loadgen import chat_request, run_load_sync  # noqa: E402
from cli.launcher import free_port  # noqa: E402

RESULTS = REPO / "bench" / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
GOALS = {"short_min_requests_per_s": 750, "short_max_frontend_cpu_ms": 1.1, "long_max_frontend_cpu_ms": 3.0}
# Words for long prompts (ordinary English prose, so the BPE tokenizer splits it like real text).
_WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches near "
          "an old river bank where people gather every morning to discuss weather politics music science "
          "history and the price of bread in small villages across the northern valley").split()


# ------------------------------------------------------------------------------------------- processes

def proc_cpu_s(pid: int) -> float:
    """utime+stime of a whole process (all threads), seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu_s(pid: int) -> dict[str, float]:
    """utime and stime per thread name (threads of one name summed): main thread vs ZeroMQ I/O threads."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_bytes()
        except OSError:
            continue
        name = stat[stat.find(b"(") + 1:stat.rfind(b")")].decode(errors="replace")
        name = "main" if task.name == str(pid) else name
        fields = stat[stat.rfind(b")") + 2:].split()
        out[name + ".user"] = out.get(name + ".user", 0.0) + int(fields[11]) / CLK_TCK
        out[name + ".sys"] = out.get(name + ".sys", 0.0) + int(fields[12]) / CLK_TCK
    return out


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def graph_pids(launcher: int) -> dict[str, int]:
    """{"frontend": pid, "router": pid, "worker-both-0": pid, ...} from the launcher's children."""
    pids: dict[str, int] = {}
    for child in children(launcher):
        args = cmdline(child)
        try:
            service = args[args.index("cli.main") + 1]
        except (ValueError, IndexError):
            continue
        if service == "worker":
            service = "worker-" + args[args.index("--worker-id") + 1]
        pids[service] = child
    return pids


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_graph(model: Path, port: int, router_port: int, log_path: Path, workers: int,
                timeout_s: float = 90.0) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "cli.main", "up", "--engine", "mock", "--mock-speedup", "inf",
           "--aggregated", str(workers), "--port", str(port), "--router-port", str(router_port),
           "--model", str(model), "--log-level", "warning"]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + timeout_s
    while not healthy(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_graph(proc)
            raise SystemExit(f"graph did not come up; see {log_path}")
        time.sleep(0.2)
    # /health needs a decode worker registered; wait for every worker to be registered (all children up).
    while len([k for k in graph_pids(proc.pid) if k.startswith("worker")]) < workers:
        time.sleep(0.1)
    return proc


def stop_graph(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------- workloads

def long_text(tokenizer, target_tokens: int, seed: int = 0) -> str:
    """A user message whose chat-templated prompt is about ``target_tokens`` tokens."""
    rng = random.Random(seed)
    words = [rng.choice(_WORDS) for _ in range(target_tokens * 2)]

    def n_tokens(k: int) -> int:
        msg = [{"role": "user", "content": " ".join(words[:k])}]
        return len(tokenizer.apply_chat_template(msg).token_ids)

    lo, hi = 1, len(words)
    while lo < hi:  # smallest word count reaching the target
        mid = (lo + hi) // 2
        if n_tokens(mid) < target_tokens:
            lo = mid + 1
        else:
            hi = mid
    return " ".join(words[:lo])


def build_requests(port: int, model_name: str, texts: list[str], max_tokens: int) -> list[bytes]:
    return [chat_request("127.0.0.1", port, {
        "model": model_name, "messages": [{"role": "user", "content": t}], "max_tokens": max_tokens,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}) for t in texts]


def measure(pids: dict[str, int], port: int, requests: list[bytes], concurrency: int,
            max_tokens: int) -> dict:
    threads0 = thread_cpu_s(pids["frontend"])
    cpu0 = {name: proc_cpu_s(pid) for name, pid in pids.items()}
    result = run_load_sync("127.0.0.1", port, requests, concurrency, expected_tokens=max_tokens)
    cpu1 = {name: proc_cpu_s(pid) for name, pid in pids.items()}
    threads1 = thread_cpu_s(pids["frontend"])
    summary = result.summary(expected_tokens=max_tokens)
    n = max(1, result.num_ok + result.num_errors)
    per_req = {name: round((cpu1[name] - cpu0[name]) * 1e3 / n, 4) for name in pids}
    workers = [k for k in pids if k.startswith("worker")]
    summary["cpu_ms_per_request"] = {
        "frontend": per_req.get("frontend"), "router": per_req.get("router"),
        "workers_total": round(sum(per_req[w] for w in workers), 4),
        **{k: per_req[k] for k in workers},
        "client": summary["client_cpu_ms_per_request"],
    }
    n_all = max(1, result.num_ok + result.num_errors)
    summary["frontend_threads_cpu_ms_per_request"] = {
        name: round((threads1[name] - threads0.get(name, 0.0)) * 1e3 / n_all, 4) for name in threads1
        if threads1[name] - threads0.get(name, 0.0) > 0}
    summary["cpu_s_total"] = {name: round(cpu1[name] - cpu0[name], 3) for name in pids}
    summary["frontend_cpu_utilisation"] = round((cpu1["frontend"] - cpu0["frontend"]) / result.wall_s, 3)
    return summary


# ------------------------------------------------------------------------------------------- conditions

def git_commit() -> dict:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                env=env, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, env=env).stdout.strip()
        return {"commit": commit, "dirty_files": dirty.splitlines()}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None}


def machine() -> dict:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"nproc": os.cpu_count(), "cpus_available": len(os.sched_getaffinity(0)), "cpu_model": model,
            "python": sys.version.split()[0], "loadavg_before": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--long-tokens", type=int, default=2000, help="target prompt tokens of workload B")
    ap.add_argument("--workloads", default="short,long")
    ap.add_argument("--warmup", type=int, default=200, help="requests sent (unmeasured) before each workload")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--client-core", type=int, default=None, help="pin the load client to this CPU")
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    ap.add_argument("--out", type=Path, default=RESULTS / "frontend.json")
    args = ap.parse_args()

    from services.frontend.tokenizer import ModelTokenizer

    if not (args.model / "config.json").exists():
        from common.tiny_model import make_tiny_model
        make_tiny_model(args.model)
    model_name = args.model.resolve().name
    tokenizer = ModelTokenizer(args.model)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.client_core is not None:
        os.sched_setaffinity(0, {args.client_core})

    port, router_port = free_port(), free_port()
    conditions = {
        "model": model_name, "osl": args.max_tokens, "concurrency": args.concurrency,
        "num_requests": args.requests, "warmup_requests": args.warmup,
        "pd_split": f"aggregated: {args.workers} workers (role both), no prefill pool",
        "engine": "mock, zero delay (--mock-speedup inf)", "router_policy": "kv",
        "block_size": 16, "transfer_backend": "none",
        "request": "POST /v1/chat/completions, stream=true, stream_options.include_usage=true, ignore_eos=true",
        "prompts": "unique per request (request index prepended to the user message)",
        "client": "bench/loadgen.py: raw asyncio+uvloop HTTP/1.1, one keep-alive connection per slot, "
                  "minimal chunked/SSE parsing, in this process",
        "client_pinned_core": args.client_core,
        "cpu_measure": "utime+stime from /proc/<pid>/stat (all threads), after minus before the measured run, "
                       f"divided by requests; clock tick {1000 // CLK_TCK} ms",
        "machine": machine(), "git": git_commit(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    workloads: dict[str, list[str]] = {}
    for name in args.workloads.split(","):
        if name == "short":
            workloads["short"] = [f"Request {i}: tell me a short story about a fox." for i in range(args.requests)]
        elif name == "long":
            base = long_text(tokenizer, args.long_tokens)
            workloads["long"] = [f"Request {i}: {base}" for i in range(args.requests)]
        else:
            raise SystemExit(f"unknown workload {name!r}")

    log_path = RESULTS / "frontend-graph.log"
    proc = start_graph(args.model, port, router_port, log_path, args.workers)
    results: dict[str, dict] = {}
    try:
        pids = graph_pids(proc.pid)
        conditions["pids"] = pids
        for name, texts in workloads.items():
            isl = len(tokenizer.apply_chat_template([{"role": "user", "content": texts[0]}]).token_ids)
            reqs = build_requests(port, model_name, texts, args.max_tokens)
            if args.warmup:
                warm = build_requests(port, model_name, [f"warmup {i} " + texts[i % len(texts)]
                                                         for i in range(args.warmup)], args.max_tokens)
                run_load_sync("127.0.0.1", port, warm, args.concurrency, expected_tokens=args.max_tokens)
            res = measure(pids, port, reqs, args.concurrency, args.max_tokens)
            res["isl_prompt_tokens"] = res["prompt_tokens_seen"]
            res["isl_first_request_local_count"] = isl
            res["request_body_bytes"] = len(reqs[0]) - reqs[0].find(b"\r\n\r\n") - 4
            results[name] = res
            if proc.poll() is not None:
                raise SystemExit(f"graph died; see {log_path}")
    finally:
        stop_graph(proc)

    short, long_ = results.get("short"), results.get("long")
    goals = dict(GOALS)
    if short:
        goals["short_requests_per_s_met"] = short["requests_per_s"] >= GOALS["short_min_requests_per_s"]
        goals["short_frontend_cpu_met"] = short["cpu_ms_per_request"]["frontend"] <= GOALS["short_max_frontend_cpu_ms"]
    if long_:
        goals["long_frontend_cpu_met"] = long_["cpu_ms_per_request"]["frontend"] <= GOALS["long_max_frontend_cpu_ms"]
    out = {"bench": "frontend", "conditions": conditions, "results": results, "goals": goals}
    args.out.write_text(json.dumps(out, indent=2) + "\n")

    print(f"frontend bench ({conditions['timestamp']}, {conditions['machine']['nproc']}x "
          f"{conditions['machine']['cpu_model']}, commit {str(conditions['git'].get('commit'))[:10]}"
          f"{' +dirty' if conditions['git'].get('dirty_files') else ''})")
    for name, r in results.items():
        c = r["cpu_ms_per_request"]
        print(f"  {name:5s} ISL {r['prompt_tokens_seen']} OSL {args.max_tokens} c={args.concurrency} "
              f"n={r['num_requests']}: {r['requests_per_s']:.0f} req/s, ok {r['completed_ok']} err {r['errors']}, "
              f"TTFT p50 {r['ttft_ms']['p50']} ms, e2e p50 {r['e2e_ms']['p50']} p99 {r['e2e_ms']['p99']} ms")
        print(f"        CPU ms/req: frontend {c['frontend']}  router {c['router']}  workers {c['workers_total']}  "
              f"client {c['client']}   (frontend busy {r['frontend_cpu_utilisation']:.0%})")
        print(f"        frontend threads CPU ms/req: {r['frontend_threads_cpu_ms_per_request']}")
    print("  goals:", {k: v for k, v in goals.items() if k.endswith("_met")})
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
