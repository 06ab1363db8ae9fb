"""A tiny random-weight couplet checkpoint (our tokenizer + a 2-layer Llama), saved to disk and loaded
back through the Auto classes, for fast unit tests. No download: built from a config."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from couplet.models.tokenizer import build_tokenizer
from couplet.training.pairs import PRESETS
from couplet.writing.phrases import HENGPI_PHRASES

# Enough characters of both tones for the constraints to have choices at every position.
TINY_CHARS = "春风明月山水花鸟云天江河东西南北红绿青白金玉龙马虎牛福寿喜安平和家国年岁诗书琴酒松竹梅兰"


def make_tiny_checkpoint(path: Path, seed: int = 0) -> Path:
    counts = Counter({c: 100 - i for i, c in enumerate(TINY_CHARS)})
    tok = build_tokenizer(counts, vocab_size=len(TINY_CHARS) + 8, must_include=HENGPI_PHRASES)
    torch.manual_seed(seed)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(PRESETS["tiny"].llama_config(len(tok.get_vocab())))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-couplet"))


@pytest.fixture(scope="session")
def tiny_lm(tiny_checkpoint):
    """The tiny checkpoint loaded back through `couplet.models.loading.load_model` (Auto classes), float32 CPU."""
    from couplet.models.loading import load_model

    return load_model(str(tiny_checkpoint), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def embedded_lm():
    """The real embedded model from assets/model, float32, on CPU (`COUPLET_TEST_DEVICE=cuda`: on a GPU, as
    scripts/gpu_check.sh runs the engine's tests there)."""
    from couplet.models.loading import EMBEDDED_MODEL, load_model

    if not (EMBEDDED_MODEL / "model.safetensors").exists():
        pytest.fail("the embedded model is missing: assets/model/model.safetensors must be committed")
    return load_model(str(EMBEDDED_MODEL), device=os.environ.get("COUPLET_TEST_DEVICE", "cpu"), dtype="float32")
