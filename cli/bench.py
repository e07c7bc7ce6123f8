"""`splitserve bench` (load an OpenAI-compatible server, write JSON + plots) and `splitserve bench compare`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

bench_app = typer.Typer(
    invoke_without_command=True, add_completion=False,
    help="Benchmark an OpenAI-compatible server (ours, vLLM's, Dynamo's): sweeps of concurrency or rate, "
         "TTFT/ITL/TPOT/e2e percentiles, throughput, goodput; JSON with every condition, and PNG plots. "
         "`splitserve bench compare A.json B.json` puts two results side by side.")


def _floats(text: Optional[str], what: str) -> list[float]:
    if not text:
        return []
    try:
        return [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"{what}: comma-separated numbers expected, not {text!r}") from None


@bench_app.callback()
def bench(
    ctx: typer.Context,
    url: str = typer.Option("http://127.0.0.1:8000", help="Server base URL (with or without /v1)"),
    model: Optional[str] = typer.Option(None, help="Model name (default: the server's first from /v1/models)"),
    endpoint: str = typer.Option("completions", help="completions (token-id prompts, exact ISL) | chat (text)"),
    workload: str = typer.Option("synthetic", help="synthetic | shared-prefix | multi-turn | trace"),
    isl: str = typer.Option("512", help="Input tokens: N, normal:MEAN:STD, uniform:LO:HI, exponential:MEAN "
                                        "(multi-turn: each turn's new user tokens)"),
    osl: str = typer.Option("128", help="Output tokens (same forms as --isl); sent as max_tokens + ignore_eos"),
    concurrency: Optional[str] = typer.Option(None, help="Closed loop: requests in flight, a sweep as 1,2,4,8"),
    rate: Optional[str] = typer.Option(None, help="Open loop: Poisson arrivals per second, a sweep as 1,2,4"),
    max_concurrency: Optional[int] = typer.Option(None, help="Open loop: cap on requests in flight"),
    num_requests: int = typer.Option(100, help="Requests per sweep point (multi-turn: turns in all)"),
    max_duration_s: float = typer.Option(300.0, help="Per sweep point: no request is sent after this"),
    timeout_s: float = typer.Option(300.0, help="Per request"),
    warmup: int = typer.Option(0, help="Unmeasured requests before each sweep point"),
    num_prefixes: int = typer.Option(4, help="shared-prefix: distinct prefixes"),
    prefix_len: int = typer.Option(512, help="shared-prefix: tokens per prefix"),
    suffix_len: str = typer.Option("64", help="shared-prefix: unique tokens after the prefix (a distribution)"),
    prefix_skew: float = typer.Option(0.0, help="shared-prefix: Zipf exponent of prefix popularity (0 uniform)"),
    warm_prefixes: bool = typer.Option(False, help="shared-prefix: send each prefix once before each point "
                                       "(the caches of a server that has served them before)"),
    turns: str = typer.Option("4", help="multi-turn: turns per session (a distribution)"),
    think_time_s: str = typer.Option("0", help="multi-turn: seconds between a turn's answer and the next turn"),
    trace: Optional[Path] = typer.Option(None, help="trace: Mooncake-style JSONL (timestamp ms, input_length, "
                                                    "output_length, hash_ids)"),
    trace_time_scale: float = typer.Option(1.0, help="trace: multiply the trace's time gaps (0.5 = twice as fast)"),
    trace_block_tokens: int = typer.Option(512, help="trace: tokens per hash id block"),
    vocab_range: str = typer.Option("100:8000", help="Synthetic token ids are drawn from [LO, HI)"),
    slo: str = typer.Option("", help="Goodput SLOs, e.g. ttft_ms=500,itl_ms=50 (keys ttft_ms tpot_ms itl_ms e2e_ms)"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Directory for run.json, point-*.json, "
                                                                       "PNGs (default bench-results/<time>)"),
    seed: int = typer.Option(0, help="Seed of lengths, prefix choice, arrivals and tokens"),
    prompt_salt: Optional[int] = typer.Option(None, help="Mixed into every prompt token; default a fresh random "
                                                         "one per run (kept in the JSON), so runs do not warm each "
                                                         "other's prefix cache. Give it to repeat exact prompts"),
    label: str = typer.Option("", help="A name for this run (kept in the JSON, used by compare)"),
    conditions: str = typer.Option("", help="Facts the client cannot see, e.g. pd=1:1,transfer_backend=nixl"),
    allow_remote: bool = typer.Option(False, help="Allow a non-loopback --url"),
    api_key: str = typer.Option("", envvar="SPLITSERVE_API_KEY", help="Bearer key for the server"),
    ignore_eos: bool = typer.Option(True, help="Send ignore_eos + min_tokens so answers have exactly OSL tokens"),
    continuous_usage: bool = typer.Option(True, help="Ask for usage on every chunk (vLLM: exact tokens per chunk)"),
    plots: bool = typer.Option(True, help="Write sweep.png and latency.png"),
    progress: bool = typer.Option(True, help="Progress line on stderr"),
) -> None:
    """Run a benchmark sweep (see --help for every flag); `compare` for two results."""
    if ctx.invoked_subcommand is not None:
        return
    from bench.lib.bench import BenchConfig, BenchError, run_bench
    from bench.lib.metrics import parse_slo
    from bench.lib.report import parse_conditions
    from bench.lib.workloads import WORKLOADS, Dist, WorkloadSpec

    try:
        if workload not in WORKLOADS:
            raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)}")
        for flag, value in (("--isl", isl), ("--osl", osl), ("--suffix-len", suffix_len), ("--turns", turns),
                            ("--think-time-s", think_time_s)):
            try:
                Dist.parse(value)
            except ValueError as exc:
                raise ValueError(f"{flag}: {exc}") from None
        lo, _, hi = vocab_range.partition(":")
        spec = WorkloadSpec(kind=workload, isl=isl, osl=osl, num_prefixes=num_prefixes, prefix_len=prefix_len,
                            suffix_len=suffix_len, prefix_skew=prefix_skew, turns=turns, think_time_s=think_time_s,
                            trace=str(trace) if trace else None, trace_time_scale=trace_time_scale,
                            block_tokens=trace_block_tokens, vocab_range=(int(lo), int(hi)))
        conc = [int(c) for c in _floats(concurrency, "--concurrency")]
        cfg = BenchConfig(
            url=url, model=model, endpoint=endpoint, workload=spec, concurrency=conc,
            rate=_floats(rate, "--rate"), max_concurrency=max_concurrency, num_requests=num_requests,
            max_duration_s=max_duration_s, timeout_s=timeout_s, warmup=warmup, warm_prefixes=warm_prefixes,
            slo=parse_slo(slo), seed=seed, prompt_salt=prompt_salt,
            output=output, label=label, conditions=parse_conditions(conditions), allow_remote=allow_remote,
            progress=progress, plots=plots, api_key=api_key, ignore_eos=ignore_eos,
            continuous_usage=continuous_usage, argv=["splitserve", *sys.argv[1:]])
        run_bench(cfg, echo=typer.echo)
    except (ValueError, BenchError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("compare")
def compare(
    a: Path = typer.Argument(..., exists=True, dir_okay=False, help="Baseline: run.json or point-<i>.json"),
    b: Path = typer.Argument(..., exists=True, dir_okay=False, help="Candidate"),
) -> None:
    """Side-by-side values of two results and the B/A ratios, sweep point by sweep point."""
    from bench.lib.compare import compare as do_compare

    try:
        typer.echo(do_compare(a, b))
    except (ValueError, KeyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
