"""`splitserve frontend`: the OpenAI-compatible HTTP server."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.admission_options import (
    DefaultTtftBudgetS,
    MaxQueued,
    MaxQueueWaitS,
    ReservedInflight,
    ReservedMaxPriority,
    TenantWeights,
    TtftBudgets,
    admission_config,
)
from cli.http_limits import (
    BodyTimeoutS,
    HeaderTimeoutS,
    HttpLimits,
    KeepaliveTimeoutS,
    MaxBodyMib,
    MaxConnections,
    MaxHeaderKib,
)
from cli.logs import configure_logging
from cli.options import (
    DEFAULT_ROUTER,
    ChatTemplate,
    EnableAutoToolChoice,
    FirstToken,
    ReasoningParser,
    ToolCallParser,
    CurveDir,
    LogJson,
    LogLevel,
    MetricsHost,
    SERVED_NAME_HELP,
    resolved_model,
    served_names,
    transport,
    validated,
)
from cli.runner import run_service
from cli.tracing_setup import OtlpTracesEndpoint, configure_tracing


def frontend(
    model: list[str] = typer.Option(..., help="HF model directory (tokenizer, chat template), or a Hugging Face id "
                                    "in the local cache (HF_HOME); repeat it to serve several models, each by its "
                                    "own workers (docs/fleet.md)"),
    served_model_name: list[str] | None = typer.Option(None, help=SERVED_NAME_HELP + "; once per --model, in "
                                                       "order"),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router endpoint, or several replicas comma-separated (any live one answers)"),
    router_inside: str = typer.Option("", help="Host a router replica in this process, with these `splitserve "
                                      "router` options (\"--endpoint tcp://127.0.0.1:5555 --policy kv\"), and route "
                                      "through it without a message; workers and kvtier list its endpoint in their "
                                      "--router like any replica's (`up --router-in-frontend`)"),
    host: str = typer.Option("127.0.0.1", envvar="SPLITSERVE_HOST"),
    port: int = typer.Option(8000, envvar="SPLITSERVE_PORT"),
    max_body_mib: float = MaxBodyMib,
    max_header_kib: float = MaxHeaderKib,
    header_timeout_s: float = HeaderTimeoutS,
    body_timeout_s: float = BodyTimeoutS,
    keepalive_timeout_s: float = KeepaliveTimeoutS,
    max_connections: int = MaxConnections,
    processes: int = typer.Option(1, min=1, envvar="SPLITSERVE_FRONTEND_PROCESSES",
                                  help="Frontend processes on --port (SO_REUSEPORT), started and restarted by this "
                                  "one; with --metrics-port P, process i serves its /metrics on P+i"),
    reuse_port: bool = typer.Option(True, help="SO_REUSEPORT: several frontend processes may share the port"),
    migration_limit: int = typer.Option(3, help="Times a request may move after losing its worker"),
    migration_wait_s: float = typer.Option(30.0, help="Seconds a request that lost its worker waits for a capable "
                                           "one (restarted or new) before it fails"),
    api_key: str = typer.Option("", envvar="SPLITSERVE_API_KEY",
                                help="Require this Bearer key on every path but --open-paths"),
    open_paths: str = typer.Option("/health,/metrics,/dashboard", help="Paths served without the API key"),
    log_prompts: bool = typer.Option(False, help="Log each request's prompt text (off: never logged)"),
    tokenizer_threads: int = typer.Option(2, help="Threads that template and tokenize long prompts"),
    metrics_port: int = typer.Option(0, help="This process's own Prometheus port (0: /metrics on --port only)"),
    metrics_host: str = MetricsHost,
    max_inflight: int = typer.Option(4096, envvar="SPLITSERVE_MAX_INFLIGHT",
                                     help="Requests in flight before new ones queue (--max-queued) or get 503"),
    max_queued: int = MaxQueued,
    max_queue_wait_s: float = MaxQueueWaitS,
    ttft_budgets: str = TtftBudgets,
    default_ttft_budget_s: float = DefaultTtftBudgetS,
    tenant_weights: str = TenantWeights,
    reserved_inflight: int = ReservedInflight,
    reserved_max_priority: int = ReservedMaxPriority,
    otlp_traces_endpoint: str = OtlpTracesEndpoint,
    chat_template: Path | None = ChatTemplate,
    tool_call_parser: str | None = ToolCallParser,
    reasoning_parser: str | None = ReasoningParser,
    enable_auto_tool_choice: bool = EnableAutoToolChoice,
    first_token: str = FirstToken,
    curve_dir: Path | None = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run the OpenAI-compatible HTTP frontend."""
    from cli.frontend_processes import copy_metrics_port, process_index, supervise

    configure_logging(log_level, log_json, "frontend")
    served = list(served_model_name or ())
    if len(served) > len(model):
        raise typer.BadParameter(f"{len(served)} names for {len(model)} models", param_hint="--served-model-name")
    refs = [resolved_model(m) for m in model]
    for ref in refs:
        validated(ref.path, need_weights=False)  # tokenizer and config only
    all_names = [served_names(served[i] if i < len(served) else None, ref.name) for i, ref in enumerate(refs)]
    flat = [n for names in all_names for n in names]
    if len(set(flat)) != len(flat):
        raise typer.BadParameter(f"a name is given to two models: {', '.join(flat)}", param_hint="--served-model-name")
    ref, names = refs[0], all_names[0]
    index = process_index()
    if chat_template is not None and not chat_template.is_file():
        raise typer.BadParameter(f"{chat_template} is not a file", param_hint="--chat-template")
    if first_token not in ("decode", "prefill"):
        raise typer.BadParameter("decode or prefill", param_hint="--first-token")
    if enable_auto_tool_choice and not tool_call_parser:
        raise typer.BadParameter("--enable-auto-tool-choice needs --tool-call-parser", param_hint="--tool-call-parser")
    admission = admission_config(max_inflight, max_queued, max_queue_wait_s, ttft_budgets, default_ttft_budget_s,
                                 tenant_weights, reserved_inflight, reserved_max_priority)
    if router_inside and processes > 1:
        raise typer.BadParameter("one process hosts one router replica: --processes 1", param_hint="--router-inside")
    if processes > 1 and index is None:  # the supervisor: no tokenizer or sockets of its own
        raise typer.Exit(supervise(processes))
    configure_tracing(otlp_traces_endpoint, "frontend")
    from services.frontend.heap import settle_heap
    from services.frontend.model_context import FrontendModel
    from services.frontend.pipeline import PipelineConfig
    from services.frontend.service import FrontendConfig, FrontendService

    limits = HttpLimits(max_body_mib=max_body_mib, max_header_kib=max_header_kib, header_timeout_s=header_timeout_s,
                        body_timeout_s=body_timeout_s, keepalive_timeout_s=keepalive_timeout_s,
                        max_connections=max_connections)
    config = FrontendConfig(
        model_name=names[0], model_aliases=names[1:], model_dir=ref.path,
        pipeline=PipelineConfig(router_endpoint=router_endpoint, migration_limit=migration_limit,
                                migration_wait_s=migration_wait_s, first_token=first_token,  # type: ignore[arg-type]
                                transport=transport(curve_dir, "frontend")),
        http=limits.http_config(host, port, reuse_port),
        api_key=api_key, max_inflight_requests=max_inflight, admission=admission, log_prompts=log_prompts,
        open_paths=tuple(p for p in open_paths.split(",") if p), num_tokenizer_threads=tokenizer_threads,
        metrics_port=copy_metrics_port(metrics_port, index), metrics_host=metrics_host,
        chat_template=chat_template.read_text() if chat_template is not None else None,
        tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
        enable_auto_tool_choice=enable_auto_tool_choice,
        extra_models=tuple(FrontendModel(n[0], r.path, n[1:]) for r, n in zip(refs[1:], all_names[1:])))
    service = FrontendService(config, *_hosted_router(router_inside, curve_dir))
    settle_heap()  # what startup built stays for good: no collection walks it again
    run_service(service.run)


def _hosted_router(options: str, curve_dir: Path | None) -> tuple:
    """(the LocalRouter to route through, (the replica's run,)) for ``--router-inside``; () without it."""
    if not options:
        return ()
    import shlex

    from cli.cmd_router import router_config_of
    from common.local_router import LocalRouter
    from services.router.service import RouterService

    args = shlex.split(options)
    if curve_dir is not None and "--curve-dir" not in args:  # the replica loads the router's keys from the same root
        args += ["--curve-dir", str(curve_dir)]
    replica = RouterService(router_config_of(args))
    return LocalRouter(replica.local), (replica.run,)
