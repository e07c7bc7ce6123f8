"""docs/multihost.md's walkthrough, run as written on three namespaced hosts: the doc cannot drift from what works.

The blocks marked ``<!-- doc-test host=X -->`` are the services each host runs, those marked ``... check`` the
commands that check them; ``$A``/``$B``/``$C`` become the hosts' bridge addresses, ``$MODEL`` the embedded tiny
model and ``$ENGINE`` the mock (the doc's dry run: the same flags and addresses, no weights; the real engines on
the same layout are tests/multihost/test_vllm_hosts.py). ``splitserve`` is this checkout's CLI.
"""

from __future__ import annotations

import json
import re
import shlex
import string
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.graph import REPO, tiny_model_dir
from tests.multihost.cluster import Cluster

pytestmark = pytest.mark.multihost

DOC = REPO / "docs" / "multihost.md"
MARK = re.compile(r"<!-- doc-test host=(?P<host>[A-Z])(?P<check> check)? -->\s*```bash\n(?P<body>.*?)```", re.S)
MOCK_BLOCK_BYTES = 36864 * 32  # the mock's KV block (docs/multihost.md's checklist)


@dataclass(frozen=True)
class DocCommand:
    host: str  # A, B or C
    check: bool  # a check to run once the services are up, not a service
    argv: tuple[str, ...]


def doc_commands(text: str, values: dict[str, str]) -> list[DocCommand]:
    """Every command of the marked blocks, continuation lines joined, ``$NAME`` substituted."""
    out = []
    for m in MARK.finditer(text):
        joined = re.sub(r"\\\n\s*", " ", m["body"])
        for line in joined.splitlines():
            if line.strip():
                argv = shlex.split(string.Template(line).substitute(values))
                out.append(DocCommand(m["host"], bool(m["check"]), tuple(argv)))
    return out


def test_the_doc_has_a_service_block_per_host_and_checks() -> None:
    commands = doc_commands(DOC.read_text(), {k: "x" for k in ("A", "B", "C", "MODEL", "ENGINE", "BLOCK_BYTES")})
    services = {(c.host, c.argv[1]) for c in commands if not c.check}
    assert services == {("A", "router"), ("A", "frontend"), ("B", "kvtier"), ("B", "worker"), ("C", "kvtier"),
                        ("C", "worker")}
    assert [c.argv[:3] for c in commands if c.check][0] == ("splitserve", "router", "workers")


def _service_name(argv: tuple[str, ...]) -> str:
    for flag in ("--worker-id", "--tier-id"):
        if flag in argv:
            return argv[argv.index(flag) + 1]
    return argv[1]


def _run(host, argv: tuple[str, ...]) -> str:
    cmd = [sys.executable, "-m", "cli.main", *argv[1:]] if argv[0] == "splitserve" else list(argv)
    result = host.run(cmd, timeout_s=60)
    assert result.returncode == 0, (argv, result.stdout, result.stderr)
    return result.stdout


def test_the_walkthrough_as_written_serves_prefill_on_b_decode_on_c(make_hosts, tmp_path: Path) -> None:
    hs = make_hosts(3)
    by_name = dict(zip("ABC", hs, strict=True))
    values = {**{name: h.address for name, h in by_name.items()}, "MODEL": str(tiny_model_dir()),
              "ENGINE": "mock", "BLOCK_BYTES": str(MOCK_BLOCK_BYTES)}
    commands = doc_commands(DOC.read_text(), values)
    cl = Cluster(hs, tmp_path, tiny_model_dir())
    cl.router_host = cl.frontend_host = by_name["A"]
    try:
        for c in commands:
            if not c.check:
                cl._start(_service_name(c.argv), by_name[c.host], list(c.argv[1:]))
        cl.wait_ready(num_prefill=1, num_decode=1, timeout_s=90)
        workers_out, health_out, completion_out = (_run(by_name[c.host], c.argv) for c in commands if c.check)
        rows = {line.split()[0]: line.split() for line in workers_out.strip().splitlines()[1:]}
        a, b, c = (values[k] for k in "ABC")
        assert rows["prefill-b"][1:4] == ["prefill", "host-b", f"tcp://{b}:5560"], workers_out
        assert rows["decode-c"][1:4] == ["decode", "host-c", f"tcp://{c}:5560"], workers_out
        health = json.loads(health_out)
        assert (health["status"], health["num_prefill_workers"], health["num_decode_workers"]) == ("ok", 1, 1)
        completion = json.loads(completion_out)
        assert completion["usage"]["prompt_tokens"] > 32, completion  # over the router's local-prefill bound
        assert completion["usage"]["completion_tokens"] == 16 and completion["choices"][0]["text"]
        logs = {s.name: s.proc.logs() for s in cl.services}
        # Where the doc says to look: B prefilled it, C pulled its KV and decoded.
        assert re.search(r"request_done .*kind=prefill", logs["prefill-b"]), logs["prefill-b"][-2000:]
        assert re.search(r"request_done .*kind=generate.*kv_transfer=pull", logs["decode-c"]), logs["decode-c"][-2000:]
        assert "kvtier_block_bytes_mismatch" not in logs["decode-c"] + logs["prefill-b"]
    finally:
        cl.stop()
