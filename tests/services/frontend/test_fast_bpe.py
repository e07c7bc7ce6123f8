"""The fast prompt encoder gives exactly the tokenizer's ids, on every shape it accepts, or steps aside."""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from tests.harness.graph import tiny_model_dir
from services.frontend import fast_bpe
from services.frontend.fast_bpe import (
    GPT2_PATTERN,
    PieceEncoder,
    ascii_pattern,
    fast_path,
    split_pattern,
    unsupported_reason,
)
from services.frontend.tokenizer import ModelTokenizer

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Pieces random texts are made of: words, contractions in both cases, numbers in several scripts, every kind of
# space and line break, symbols, accents and combining marks, CJK, emoji, case-folding oddities, specials and
# their prefixes.
_CHUNKS = ["hello", "World", " the", "  ", " ", "\t", "\n", "\n\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f",
           "\x85", "\u00a0", "\u2003", "\u3000", "\u2028", "\u200b", "'s", "'S", "'ll", "'LL", "'re", "'Ve", "'",
           "don't", "123", "4567890", "\u0663\u0664", "\u2460", "\u00b2", "\u216b", "3.14", "...", "!!", "$", "_",
           "caf\u00e9", "e\u0301", "\u03b1\u03b2\u03b3", "\u65e5\u672c\u8a9e", "\U0001f642", "\U0001f468\u200d\U0001f469",
           "\u017f", "\u212a", "\u0130", "\ufb01", "def f(x):", "    return x", "<|", "<|im_sta", *SPECIALS]


def random_texts(num: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = ["", " ", "\n", SPECIALS[1] + SPECIALS[2], "a" + SPECIALS[0] + "b"]
    for _ in range(num):
        parts = [rng.choice(_CHUNKS) for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.2:  # any ASCII character, control characters included
            parts = ["".join(chr(rng.randint(0, 127)) for _ in range(rng.randint(1, 40)))]
        elif rng.random() < 0.3:  # any code point at all, outside the surrogates
            parts += [chr(rng.choice([rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))
                      for _ in range(rng.randint(1, 5))]
            rng.shuffle(parts)
        texts.append("".join(parts))
    return texts


def stdlib_texts() -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40:4]
    return [f.read_text(errors="ignore")[:20_000] for f in files]


def hf_ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode_batch_fast([text], add_special_tokens=False)[0].ids


def trained(pre_tokenizer, vocab_size: int = 800) -> tuple[Tokenizer, dict]:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(stdlib_texts(), trainer=trainer)
    return tok, json.loads(tok.to_str())


def split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


@pytest.fixture(scope="module")
def tiny() -> tuple[Tokenizer, dict]:
    path = tiny_model_dir() / "tokenizer.json"
    return Tokenizer.from_file(str(path)), json.loads(path.read_text())


@pytest.fixture(scope="module", params=["gpt2", "llama3", "qwen2"])
def shaped(request) -> tuple[Tokenizer, dict]:
    if request.param == "gpt2":
        return trained(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    return trained(split_then_bytes(LLAMA3_PATTERN if request.param == "llama3" else QWEN2_PATTERN))


def test_the_embedded_models_tokenizer_takes_the_fast_path_and_gives_its_ids(tiny):
    tok, spec = tiny
    path = fast_path(tok, spec)
    assert path.reason == "" and path.encoder is not None
    for text in stdlib_texts() + random_texts(400, seed=1):
        assert path.encoder.encode(text) == hf_ids(tok, text), repr(text[:200])


def test_model_tokenizer_encodes_with_it():
    tok = ModelTokenizer(tiny_model_dir())
    assert tok.fast_path.encoder is not None
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi there, it's me."}])
    assert prompt.token_ids == hf_ids(tok.tokenizer, prompt.text)
    assert prompt.token_ids.count(tok.tokenizer.token_to_id("<|im_start|>")) == 2


def test_every_accepted_shape_gives_the_tokenizers_ids(shaped):
    tok, spec = shaped
    path = fast_path(tok, spec)
    assert path.reason == "" and path.encoder is not None
    assert path.encoder._ascii_split is not None  # ASCII text takes the stdlib `re` splitter
    for text in stdlib_texts() + random_texts(300, seed=2):
        assert path.encoder.encode(text) == hf_ids(tok, text), repr(text[:200])


def test_a_character_the_two_regex_engines_class_differently_sends_the_text_to_the_tokenizer(tiny):
    tok, spec = tiny
    # This splitter takes only Latin letters for letters: Greek is "other" to it, a letter to HF.
    encoder = PieceEncoder(tok, GPT2_PATTERN.replace(r"\p{L}", r"\p{Latin}"), [(s, False) for s in SPECIALS])
    assert encoder.encode("hello world") == hf_ids(tok, "hello world")
    assert encoder.num_fallbacks == 0
    greek = "hello \u03b1\u03b2\u03b3 world"
    assert encoder.encode(greek) == hf_ids(tok, greek)
    assert encoder.num_fallbacks == 1


def test_an_encoder_that_differs_on_ascii_encodes_nothing_itself(tiny):
    tok, _ = tiny
    encoder = PieceEncoder(tok, GPT2_PATTERN.replace(r"\p{L}", "[a-z]"), [(s, False) for s in SPECIALS])
    assert encoder.encode("Hello World") == hf_ids(tok, "Hello World")
    assert encoder.num_fallbacks == 1


def test_a_text_with_a_huge_piece_goes_to_the_tokenizer_whole(tiny):
    tok, spec = tiny
    encoder = fast_path(tok, spec).encoder
    text = "see " + "ab" * 200 + " and " + "7" * 300 + " end"
    assert encoder.encode(text) == hf_ids(tok, text)
    assert encoder.num_fallbacks == 1


def test_a_spec_that_misdescribes_the_tokenizer_fails_the_sample_check(tiny):
    _, spec = tiny
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.normalizer = normalizers.Lowercase()  # not in the spec: the splits agree, the ids do not
    path = fast_path(tok, spec)
    assert path.encoder is None and path.reason == "differs from the tokenizer on the sample text"
    unknown = {**spec, "added_tokens": [*spec["added_tokens"], {"content": "<|nowhere|>"}]}
    assert fast_path(Tokenizer.from_str(json.dumps(spec)), unknown).reason == "added token '<|nowhere|>' has no id"


def test_the_piece_cache_stays_bounded_and_right(tiny, monkeypatch):
    tok, spec = tiny
    monkeypatch.setattr(fast_bpe, "MAX_CACHED_PIECES", 8)
    encoder = fast_path(tok, spec).encoder
    for text in stdlib_texts()[:3]:
        assert encoder.encode(text) == hf_ids(tok, text)
        assert len(encoder._ids) <= 8


GPT2_SPEC = {"model": {"type": "BPE"}, "normalizer": None,
             "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
             "added_tokens": [{"content": "<s>", "single_word": False, "lstrip": False, "rstrip": False}]}
SPLIT = {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False}
BYTES = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}


@pytest.mark.parametrize("change, reason", [
    ({}, ""),
    ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT, BYTES]}}, ""),
    ({"model": {"type": "WordPiece"}}, "model type 'WordPiece' is not BPE"),
    ({"model": {"type": "BPE", "byte_fallback": True}}, "BPE dropout or byte fallback"),
    ({"model": {"type": "BPE", "dropout": 0.1}}, "BPE dropout or byte fallback"),
    ({"normalizer": {"type": "NFC"}}, "the tokenizer has a normalizer"),
    ({"truncation": {"max_length": 8}}, "the tokenizer truncates or pads"),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}},
     "pre-tokenizer is not byte-level BPE's regex split"),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}},
     "pre-tokenizer is not byte-level BPE's regex split"),
    ({"pre_tokenizer": {"type": "Metaspace"}}, "pre-tokenizer is not byte-level BPE's regex split"),
    ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{**SPLIT, "invert": True}, BYTES]}},
     "pre-tokenizer is not byte-level BPE's regex split"),
    ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{**SPLIT, "behavior": "Removed"}, BYTES]}},
     "pre-tokenizer is not byte-level BPE's regex split"),
    ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT, {**BYTES, "use_regex": True}]}},
     "pre-tokenizer is not byte-level BPE's regex split"),
    ({"added_tokens": [{"content": "<s>", "lstrip": True}]}, "added token '<s>' has single_word/lstrip/rstrip"),
])
def test_unsupported_reason(change, reason):
    assert unsupported_reason({**GPT2_SPEC, **change}) == reason


def test_split_pattern_of_each_shape():
    assert split_pattern(GPT2_SPEC) == GPT2_PATTERN
    assert split_pattern({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT, BYTES]}}) == QWEN2_PATTERN
    assert split_pattern({"pre_tokenizer": None}) is None


@pytest.mark.parametrize("pattern, ascii", [
    (GPT2_PATTERN, r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""),
    (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}", r"[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]{1,3}"),
    (r"[]\p{L}]x", r"[]A-Za-z]x"),  # "]" first in a set is a literal
    (r"\\p{L}", r"\\p{L}"),  # an escaped backslash, then "p{L}" as text
    (r"\p{Lu}+", None),
    (r"\P{L}", None),
    (r"[\p{L}--[a]]", None),
])
def test_ascii_pattern(pattern, ascii):
    assert ascii_pattern(pattern) == ascii
