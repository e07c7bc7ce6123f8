"""Measuring splitserve: the product `splitserve bench` and the issue benchmarks, apart.

Layout, and why:

- ``bench/lib/`` is a library, installed with the package. Its product modules are `splitserve bench`
  (``bench``, ``runner``, ``workloads``, ``report``, ``compare``, ``plots``; reached through cli/bench.py):
  any OpenAI-compatible server, any user. Beside them sits what the product and the issue benchmarks (and the
  tests) share, so that each exists once: ``client`` (the one HTTP/SSE client), ``metrics`` (the definitions
  of TTFT, ITL, TPOT, goodput), ``server`` (models, layout, Prometheus), ``machine`` (the one ``machine()``),
  ``procs`` (CPU and memory from /proc),
  ``load`` (fixed request bodies, closed loop) and ``results`` (a benchmark's model, conditions, JSON file).
- ``bench/<name>.py`` is an issue benchmark: a module run from the checkout, ``python -m bench.<name> --help``. It is its workload
  and its report, nothing else; a large one is split into ``<name>.py`` (the run) and ``<name>_report.py``
  or ``<name>_workload.py`` (its parts). They write JSON with conditions under bench/results/.
  ``kv_transfer.py`` is the KV-pull analysis interference.py and its tests share.
- ``bench/profiles/``: engine timing profiles (`splitserve profile`) the planner benchmarks replay.

Benchmarks that start process graphs or namespaced hosts take them from the tests' harness
(``tests/harness/``: the one harness, owned by the tests), which is why they run as ``python -m bench.<name>``
from the checkout; ``bench/lib/`` itself imports nothing from tests/ (it ships with the package). No
``sys.path`` edits anywhere.
"""
