"""The live dashboard renders real data from a running graph in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess

from tests.harness.graph import Graph
from tests.e2e.test_openai_api import MODEL, client

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=4000", *args],
        capture_output=True, text=True, timeout=90)


def test_dashboard_shows_workers_and_latencies(mock_pd: Graph, tmp_path) -> None:
    # Chromium installs from Debian's packages on every machine here (.ci/run does it): missing is breakage.
    assert CHROMIUM is not None, "chromium is not installed: apt-get install chromium (make test installs it: scripts/test_deps.sh)"
    for _ in range(3):
        client(mock_pd).completions.create(model=MODEL, prompt=list(range(20, 700)), max_tokens=4)
    dom = _chromium(tmp_path, "--dump-dom", mock_pd.url + "/dashboard").stdout
    # Rendered by the page's script from /dashboard/data, not present in the static HTML.
    assert "prefill-0" in dom and "decode-1" in dom
    assert 'class="role-prefill"' in dom and 'class="role-decode"' in dom
    assert "TTFT p50 / p99 ms" in dom and "connecting…" not in dom
    shot = tmp_path / "dashboard.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1100,700", mock_pd.url + "/dashboard")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
