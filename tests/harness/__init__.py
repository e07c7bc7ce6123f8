"""The tests' harness: process graphs on this machine (graph.py), namespaced hosts (hosts.py, host_runs.py,
host_graph.py) and a bare vLLM engine driver (vllm_smoke.py). Benchmarks that start graphs import it from here;
nothing under services/, common/ or cli/ does."""
