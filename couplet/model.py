"""Loading the language model: the embedded checkpoint in assets/, a local path, or a hub id.

Everything goes through transformers' Auto classes, so the KV-cache work runs on the same classes as
hub models. The model's dtype and device are chosen here once and recorded for the accounting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from couplet.text import is_han
from couplet.tokenizer import FormatIds

EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "assets" / "model"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_source(name: str | None) -> str:
    """`None` → `$COUPLET_MODEL` or the embedded model; `modelscope:ORG/NAME` → a ModelScope download."""
    name = name or os.environ.get("COUPLET_MODEL") or str(EMBEDDED_MODEL)
    if name.startswith("modelscope:"):
        from modelscope import snapshot_download  # imported lazily: only this path needs it

        return snapshot_download(name.removeprefix("modelscope:"))
    return name


@dataclass(eq=False)  # hashable by identity: per-model lookups are cached on it
class LoadedModel:
    """A model with its tokenizer, plus the lookups generation needs every step (computed once)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str
    device: str
    dtype: torch.dtype
    ids: FormatIds = field(init=False)

    def __post_init__(self) -> None:
        self.ids = FormatIds.of(self.tokenizer)

    @cached_property
    def vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    @cached_property
    def id_to_char(self) -> list[str]:
        chars = [""] * len(self.vocab)
        for tok, i in self.vocab.items():
            chars[i] = tok
        return chars

    @cached_property
    def han_ids(self) -> torch.Tensor:
        """Ids of single Han characters: the only tokens a couplet line may contain."""
        return torch.tensor([i for t, i in self.vocab.items() if len(t) == 1 and is_han(t)], dtype=torch.long)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def load_model(name: str | None = None, device: str | None = None, dtype: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer. Defaults: CUDA if present, bfloat16 on CUDA, float32 on CPU."""
    device = device or default_device()
    dtype_name = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if dtype_name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype_name!r}; choose from {sorted(DTYPES)}")
    hf_logging.disable_progress_bar()  # no loading bars in the CLI's output or the app's logs
    source = resolve_source(name)
    if not Path(source).exists() and "/" not in source:
        raise FileNotFoundError(f"model not found: {source!r} (a local folder, a hub id, or modelscope:ORG/NAME)")
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype_name])
    model.to(device)  # type: ignore[arg-type]  # transformers' stubs mistype the wrapped .to()
    model.eval()
    return LoadedModel(model, tokenizer, source, device, DTYPES[dtype_name])
