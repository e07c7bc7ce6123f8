"""Prompt encoding CPU: HF tokenizers' fastest call vs the frontend's fast encoder (services/frontend/fast_bpe.py).

Each corpus is cut into consecutive prompts of ~2,000 tokens; every prompt is encoded by HF (`encode_batch_fast`,
no offsets), then by a fresh fast encoder over all of them (first pass: its piece cache fills as it goes) and
again (second pass: every piece seen).
Both must give the same ids (checked on every prompt). CPU is this process's thread time per prompt.

  prose: the license texts Debian ships (/usr/share/common-licenses/*): English with a few thousand distinct words.
  code:  the stdlib's .py sources (what the embedded tiny model's tokenizer was trained on).
  bench: the 55-word prose of bench/frontend.py's 2,000-token prompts (its cache always hits).

    python -m bench.encoder [--model models/tiny] [--prompts 40]

Writes bench/results/encoder.json (results + conditions) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import time
from pathlib import Path

from bench.frontend import long_text
from bench.lib.results import RESULTS, conditions, ensure_tiny_model, finish, write_result
from services.frontend.fast_bpe import fast_path
from services.frontend.tokenizer import ModelTokenizer

REPO = Path(__file__).resolve().parent.parent
LICENSES = Path("/usr/share/common-licenses")


def corpora(tokenizer: ModelTokenizer) -> dict[str, str]:
    code = "".join(p.read_text(errors="ignore") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:60])
    out = {"code": code, "bench": " ".join(long_text(tokenizer, 2000, seed=s) for s in range(8))}
    licenses = sorted(p for p in LICENSES.glob("*") if p.is_file() and not p.is_symlink()) if LICENSES.is_dir() else []
    if licenses:
        out["prose"] = "\n\n".join(p.read_text(errors="ignore") for p in licenses)
    return out


def prompts(tokenizer: ModelTokenizer, text: str, num: int, tokens: int = 2000) -> list[str]:
    """Consecutive cuts of ``text`` of about ``tokens`` tokens each (the corpus's own characters per token)."""
    sample = text[:200_000]
    chars = int(tokens * len(sample) / max(1, len(tokenizer.tokenizer.encode(sample).ids)))
    cuts = [text[i:i + chars] for i in range(0, len(text) - chars + 1, chars)]
    return cuts[:num]


def cpu_ms(fn, items: list[str]) -> list[float]:
    out = []
    for item in items:
        t0 = time.thread_time()
        fn(item)
        out.append((time.thread_time() - t0) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--out", type=Path, default=RESULTS / "encoder.json")
    args = ap.parse_args()
    ensure_tiny_model(args.model)
    tok = ModelTokenizer(args.model)
    spec = json.loads((args.model / "tokenizer.json").read_text())
    cond = conditions("encoder", model=args.model.resolve().name, prompt_tokens=2000, num_prompts=args.prompts,
                      cpu_measure="time.thread_time() around each call, this process only",
                      hf_call="Tokenizer.encode_batch_fast([text], add_special_tokens=False)")
    results = {}
    for name, text in corpora(tok).items():
        items = prompts(tok, text, args.prompts)
        hf = lambda s: tok.tokenizer.encode_batch_fast([s], add_special_tokens=False)[0].ids  # noqa: E731
        encoder = fast_path(tok.tokenizer, spec).encoder
        assert encoder is not None
        expected = [hf(s) for s in items]
        assert [encoder.encode(s) for s in items] == expected, f"{name}: fast ids differ"
        cold = fast_path(tok.tokenizer, spec).encoder
        r = {"num_prompts": len(items), "mean_prompt_tokens": round(statistics.mean(len(e) for e in expected)),
             "mean_prompt_chars": round(statistics.mean(len(s) for s in items)),
             "hf_ms": statistics.median(cpu_ms(hf, items)),
             "fast_first_pass_ms": statistics.median(cpu_ms(cold.encode, items)),
             "fast_second_pass_ms": statistics.median(cpu_ms(cold.encode, items)),
             "fallbacks": cold.num_fallbacks}
        r = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
        results[name] = r
        print(f"{name:6s} {r['num_prompts']} prompts of ~{r['mean_prompt_tokens']} tokens: HF {r['hf_ms']} ms, "
              f"fast {r['fast_first_pass_ms']} ms first pass / {r['fast_second_pass_ms']} ms second (median CPU a prompt)")
    finish(cond)
    print("wrote", write_result(args.out, {"bench": "encoder", "conditions": cond, "results": results}))


if __name__ == "__main__":
    main()
