"""Loading the language model: the embedded checkpoint in assets/, a local path, a Hugging Face id or
`modelscope:ORG/NAME` (`couplet.models.hub`), in float32/bfloat16/float16, optionally with int8/nf4 weights
(bitsandbytes, CUDA only).

Everything goes through transformers' Auto classes, so the KV-cache work runs on the same classes as
hub models. The model's dtype and device are chosen here once and recorded for the accounting.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from couplet.models.families import Family, UnsupportedFamily, detect
from couplet.models.hub import WEIGHTS, ModelUnavailable, resolve
from couplet.models.palm import is_palm, load_palm
from couplet.models.tokenizer import FormatIds
from couplet.writing.text import visitor_part
from couplet.writing.vocab import CharVocab

EMBEDDED_MODEL = Path(__file__).resolve().parents[2] / "assets" / "model"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_source(name: str | None) -> str:
    """`None` → `$COUPLET_MODEL` or the embedded model; a folder, a Hugging Face id or `modelscope:ORG/NAME`
    → a local folder (`couplet.models.hub`; raises ModelUnavailable, naming what was tried)."""
    return resolve(name or os.environ.get("COUPLET_MODEL") or str(EMBEDDED_MODEL))


class UnsupportedModel(ModelUnavailable):
    """A checkpoint that loads but does not speak this project's couplet format."""


def _once(prefix: str) -> Callable[[logging.LogRecord], bool]:
    """A logging filter that lets the first record starting with `prefix` through and drops the rest."""
    seen = False

    def keep(record: logging.LogRecord) -> bool:
        nonlocal seen
        if not record.getMessage().startswith(prefix):
            return True
        first, seen = not seen, True
        return first

    return keep


_INT8_CAST_NOTE = _once("MatMul8bitLt: inputs will be cast")


def quantization_config(weights: str | None, device: str, dtype: torch.dtype):
    """`BitsAndBytesConfig` for `--weights int8|nf4`; refused off CUDA (bitsandbytes' kernels are GPU ones —
    a CPU load would be silently full precision or fail deep inside)."""
    if weights is None:
        return None
    if weights not in WEIGHTS:
        raise ValueError(f"unknown --weights {weights!r}; choose from {', '.join(WEIGHTS)}")
    if not device.startswith("cuda"):
        raise ValueError(f"--weights {weights} 需要 CUDA：bitsandbytes 的 8 位/4 位权重只在 GPU 上运行；CPU 上请去掉 "
                         f"--weights（或用 --dtype bfloat16 减半权重）。 (--weights {weights} needs a CUDA device; "
                         f"got {device})")
    from transformers import BitsAndBytesConfig

    if weights == "int8":
        # bitsandbytes logs "MatMul8bitLt: inputs will be cast from bfloat16 to float16" at every int8 matmul
        # (hundreds per couplet, seen on the GPU check): once is information, the rest is noise
        logging.getLogger("bitsandbytes.autograd._functions").addFilter(_INT8_CAST_NOTE)  # idempotent
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
                              bnb_4bit_use_double_quant=True)


@dataclass(eq=False)  # hashable by identity: per-model lookups are cached on it
class LoadedModel:
    """A model with its tokenizer, plus the lookups generation needs every step (computed once)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str
    device: str
    dtype: torch.dtype
    family: Family  # how it is prompted (`couplet.models.families`)
    weights: str | None = None  # bitsandbytes quantization of the weights, if any

    @cached_property
    def ids(self) -> FormatIds:
        """The couplet format's special ids (family `couplet` only: training, NLL scoring, the 横批's PMI)."""
        return FormatIds.of(self.tokenizer)

    @cached_property
    def chars(self) -> CharVocab:
        """The character table (`couplet.writing.vocab`): what the decoding rules work with."""
        return CharVocab.of(self.tokenizer, self.family.byte_level, int(self.model.config.vocab_size))

    @property
    def vocab(self) -> dict[str, int]:
        return self.chars.vocab

    @property
    def id_to_char(self) -> list[str]:
        return self.chars.id_to_char

    @property
    def han_ids(self) -> torch.Tensor:
        return self.chars.han_ids

    def char_ids(self, text: str) -> list[int]:
        """One id per character (unknown ones: the family's unknown token)."""
        return [self.vocab.get(c, self.family.unk) for c in text]

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @cached_property
    def weight_bytes(self) -> int:
        """Bytes the weights (and buffers) occupy as loaded: the other lever beside the KV cache."""
        return int(self.model.get_memory_footprint())


def load_model(name: str | None = None, device: str | None = None, dtype: str | None = None,
               weights: str | None = None) -> LoadedModel:
    """Load a model and its tokenizer (a causal LM, a T5 through transformers' Auto classes, or PALM through
    ModelScope's, `couplet.models.palm`). Defaults: CUDA if present, bfloat16 on CUDA, float32 on CPU.
    `weights`: int8 or nf4 through bitsandbytes (CUDA only). Raises ModelUnavailable when the model cannot
    be fetched or does not speak the couplet format, ValueError for a bad option."""
    device = device or default_device()
    dtype_name = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if dtype_name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype_name!r}; choose from {sorted(DTYPES)}")
    quant = quantization_config(weights, device, DTYPES[dtype_name])
    hf_logging.disable_progress_bar()  # no loading bars in the CLI's output or the app's logs
    source = resolve_source(name)
    if is_palm(source):  # ModelScope's PALM: its own classes, not transformers' Auto ones (`couplet.models.palm`)
        palm, tokenizer = load_palm(source, device, DTYPES[dtype_name], weights)
        family = detect(tokenizer, "palm", palm.config.decoder_start_token_id)
        return LoadedModel(palm, tokenizer, source, device, DTYPES[dtype_name], family)  # type: ignore[arg-type]
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.from_pretrained(source)
    try:  # before the weights: a family we cannot prompt is refused at once
        family = detect(tokenizer, config.model_type, getattr(config, "decoder_start_token_id", 0) or 0)
    except UnsupportedFamily as e:
        raise UnsupportedModel(f"模型「{name or source}」：{e}") from None
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    # use_kernels=False: transformers (5.25) otherwise swaps layers for Hugging Face Hub kernels wherever the
    # `kernels` package is installed and the model is placed on CUDA at load (the bitsandbytes path below):
    # a download at load time, refused offline ("could not verify publisher trust status", seen on the GPU
    # check), and layers that are no longer the ones our attention function and caches are tested with.
    if quant is not None:
        model = auto.from_pretrained(source, dtype=DTYPES[dtype_name], quantization_config=quant,
                                     device_map={"": device}, use_kernels=False)
    else:
        model = auto.from_pretrained(source, dtype=DTYPES[dtype_name], use_kernels=False)
        model.to(device)  # type: ignore[arg-type]  # transformers' stubs mistype the wrapped .to()
    model.eval()
    return LoadedModel(model, tokenizer, source, device, DTYPES[dtype_name], family, weights)


def load_model_or_embedded(name: str | None = None, device: str | None = None, dtype: str | None = None,
                           weights: str | None = None) -> tuple[LoadedModel, str]:
    """The app's loader: the asked-for model, or — when it cannot be had — the embedded one, with a Chinese
    notice saying what happened (empty when nothing did)."""
    asked = name or os.environ.get("COUPLET_MODEL")
    try:
        return load_model(name, device, dtype, weights), ""
    except (ModelUnavailable, ValueError, OSError) as e:
        if not asked or asked == str(EMBEDDED_MODEL):
            raise  # the embedded model itself is broken: nothing to fall back to
        reason = visitor_part(e)
        return (load_model(str(EMBEDDED_MODEL), device, dtype),
                f"未能加载模型「{asked}」：{reason} 已改用内置小模型。")
