"""The design docs against the tree: every anchor the code cites exists, every path they name exists, and every
`splitserve` command line in docs/multihost.md parses with the real CLI."""

from __future__ import annotations

import re
import shlex
import string
import subprocess
from pathlib import Path

import pytest

from tests.test_deploy import _check_args, _commands, _parse, _runs_alone

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
MULTIHOST = DOCS / "multihost.md"
TOP_DIRS = ("services/", "common/", "cli/", "bench/", "tests/", "deploy/", "docs/", "scripts/")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", path.read_text(), re.M)}


def _tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    return [ROOT / line for line in out.stdout.splitlines() if (ROOT / line).is_file()]


def test_slug_matches_githubs() -> None:
    assert _slug("A request's path") == "a-requests-path"
    assert _slug("NIXL facts") == "nixl-facts"
    assert _slug("pyzmq and asyncio") == "pyzmq-and-asyncio"


def test_every_cited_architecture_anchor_exists() -> None:
    anchors = _anchors(ARCHITECTURE)
    cited: dict[str, set[str]] = {}
    for path in _tracked_files():
        if path.suffix in (".png", ".json"):
            continue
        for anchor in re.findall(r"architecture\.md#([\w-]+)", path.read_text(errors="replace")):
            cited.setdefault(anchor, set()).add(str(path.relative_to(ROOT)))
    assert cited, "the code cites docs/architecture.md sections"
    missing = {anchor: sorted(files) for anchor, files in cited.items() if anchor not in anchors}
    assert not missing, f"anchors cited but not in docs/architecture.md: {missing}"
    # The sections the code and the docs rely on.
    assert {"processes", "a-requests-path", "contracts", "engines", "nixl-facts", "pyzmq-and-asyncio", "kv-tiers",
            "measuring", "containers", "across-hosts"} <= anchors


def test_named_paths_exist_and_no_team_notebook() -> None:
    for doc in (ARCHITECTURE, MULTIHOST):
        text = doc.read_text()
        assert "DESIGN.md" not in text and "shared/" not in text, f"{doc.name} cites the team notebook"
        for path in re.findall(r"`([\w./-]+)`", text):
            if path.startswith(TOP_DIRS):
                assert (ROOT / path).exists(), f"{doc.name} names {path}, which is not in the tree"
        for link in re.findall(r"\]\(([\w./-]+)(?:#([\w-]+))?\)", text):
            target, anchor = DOCS / link[0], link[1]
            assert target.exists(), f"{doc.name} links to {link[0]}"
            assert not anchor or anchor in _anchors(target), f"{doc.name} links to {link[0]}#{anchor}"


def _splitserve_lines(text: str) -> list[list[str]]:
    """Each `splitserve <command> ...` line of the bash blocks, continuation lines joined, the doc's shell
    variables ($A, $MODEL, ...) given the example values it sets (`A=10.0.0.1 B=... MODEL=...`)."""
    values = dict(re.findall(r"\b([A-Z_]+)=(\S+)", next(iter(re.findall(r"^A=.*$", text, re.M)), "")))
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("splitserve "):
                lines.append(shlex.split(string.Template(line).substitute(values))[1:])
    return lines


def test_multihost_commands_are_real() -> None:
    commands = _commands()
    lines = _splitserve_lines(MULTIHOST.read_text())
    assert {args[0] for args in lines} >= {"router", "frontend", "worker", "kvtier", "keys"}
    for args in lines:
        command = commands[args[0]]
        if hasattr(command, "commands") and not _runs_alone(command, args[1:]):  # a group: `keys make`
            command, args = command.commands[args[1]], args[1:]
        _check_args(command, args[1:], f"docs/multihost.md: splitserve {' '.join(args)}")
        _parse(command, args[1:], f"docs/multihost.md: splitserve {' '.join(args)}")


# ---------------------------------------------------------------------------------------- README and every page
README = ROOT / "README.md"
PAGES = sorted(DOCS.glob("*.md"))


def test_readme_is_an_entry_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: details belong in docs/"
    for heading in ("## Two commands", "## Your model on your GPUs", "## Where splitserve loses",
                    "## Where to go next"):
        assert heading in lines, f"README.md has no {heading!r}"


def test_links_and_paths_in_readme_and_docs_resolve() -> None:
    for doc in (README, *PAGES):
        text = doc.read_text()
        assert "DESIGN.md" not in text and "../shared" not in text, f"{doc.name} cites the team notebook"
        for path in re.findall(r"`([\w./-]+)`", text):
            if path.startswith(TOP_DIRS) and "*" not in path:
                assert (ROOT / path).exists(), f"{doc.name} names {path}, which is not in the tree"
        for target, anchor in re.findall(r"\]\(([\w./-]+?)(?:#([\w-]+))?\)", text):
            if target.startswith(("http:", "https:")):
                continue
            resolved = (doc.parent / target).resolve()
            assert resolved.exists(), f"{doc.name} links to {target}, which does not exist"
            if anchor:
                assert resolved.suffix == ".md" and anchor in _anchors(resolved), f"{doc.name} links to {target}#{anchor}"


def _readme_splitserve_lines(doc: Path = README) -> list[list[str]]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #", 1)[0].strip().removeprefix(".venv/bin/").rstrip("&").strip()
            if line.startswith("splitserve "):
                lines.append(shlex.split(line)[1:])
    return lines


@pytest.mark.parametrize("doc", [README, DOCS / "gpus.md"], ids=lambda d: d.name)
def test_readme_commands_parse_engine_arguments_included(doc: Path) -> None:
    """Every `splitserve` line of README (and docs/gpus.md) parses with the real CLI; what `up` and `worker` hand to vLLM (and each
    pool's --prefill-args/--decode-args) parses with vLLM's own parser, as the commands do before starting."""
    from services.worker.engines.vllm.engine_args import parse_engine_args

    commands = _commands()
    lines = _readme_splitserve_lines(doc)
    assert {args[0] for args in lines} >= ({"up", "worker", "model"} if doc == README else {"up", "worker"})
    for args in lines:
        where = f"{doc.name}: splitserve {' '.join(args)}"
        command = commands[args[0]]
        if hasattr(command, "commands") and not _runs_alone(command, args[1:]):
            command, args = command.commands[args[1]], args[1:]
        args = [a for i, a in enumerate(args) if a != "--config" and (i == 0 or args[i - 1] != "--config")]  # a
        # user's file, not in the tree (tests/cli/test_config_file.py tests the expansion)
        try:
            ctx = command.make_context(command.name or "splitserve", list(args[1:]))
        except Exception as exc:  # click's UsageError and friends
            pytest.fail(f"{where}: {exc.format_message() if hasattr(exc, 'format_message') else exc!r}")
        engine_argv = [a for a in ctx.args if a != "--"]
        for pool in ("prefill_args", "decode_args"):
            engine_argv += shlex.split(ctx.params.get(pool) or "")
        parse_engine_args(engine_argv)  # raises EngineArgsError with vLLM's message
