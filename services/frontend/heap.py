"""Garbage-collector settings for the frontend process, applied once its startup is done.

By startup the process holds ~50-70k GC-tracked objects (modules, classes, typing and Prometheus state) that never
become garbage, yet every full collection walks them all (12-60 ms each), and CPython's default first-generation
threshold (700 container allocations) runs a young collection every few requests, promoting the containers of the
~64 requests in flight into older generations, whose collections then grow. Measured on the frontend bench
(bench/frontend.py, 2,000-token and short prompts, c=64): collections took ~4% of the frontend's CPU on long
prompts and ~9% on short ones; with the startup heap frozen and a first-generation threshold of 10,000 under 0.1%.
"""

from __future__ import annotations

import gc

# Container allocations (net) between young collections: a request's short-lived dicts, lists and frames mostly
# die before one runs. Garbage in cycles waits at most this many allocations longer (a few MB at most).
GEN0_THRESHOLD = 10_000


def settle_heap(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    """Collects once, moves every surviving object to the permanent generation (never scanned again) and raises
    the first generation's threshold; later generations keep their thresholds."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
