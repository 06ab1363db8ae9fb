"""ModelScope's PALM 2.0 — the source article's model — driven by this project's loop.

PALM (`modelscope.models.nlp.palm_v2`) is a BERT encoder with a hand-written Transformer decoder. Its own
`Translator` runs beam search over a per-layer dict cache (`self_keys`/`self_values`, concatenated every
step; `memory_keys`/`memory_values`, the encoder's once). ModelScope's pipeline does not import on
transformers 5 (`GreedySearchDecoderOnlyOutput` is gone), but its model classes do, so:

- the weights load through ModelScope's own classes (`PalmConfig`, `PalmForTextGeneration`): the real
  code path, no re-implementation of the checkpoint layout;
- `PalmDecoderLM` runs the same modules' weights step by step with transformers' caches instead of the dict:
  the decoder's self-attention keys and values go through `Cache.update` — so every mode's layers
  (`couplet.kvcache`), its accounting and the recording attention function see them exactly as they see a
  Llama's — and the cross-attention memory is projected once from the encoder into a plain `DynamicCache`.

Why not wrap PALM's own decoder forward: its attention concatenates onto the dict and computes the scores
itself, so no compressed layer could stand in for the dict, and no attention could be recorded.

What each mode does here:
- the self-attention cache is compressed by every mode that stores, quantizes or evicts: PALM adds absolute
  sinusoidal positions to the embeddings before the projections (`PositionalEncoding`), so an evicted key
  takes nothing from the keys that stay, and positions follow the logical length the cache reports;
- the cross-attention memory (2 × layers × source tokens × hidden) is computed once per request, kept at the
  model's precision and never evicted: it is fixed by the input, does not grow while decoding, and every
  step reads all of it;
- prefix sharing is refused (`PalmFamily.mode_refusal`): the decoder's prompt is one start token.

Output parity with PALM's own decoder is tested (`tests/test_palm.py`): the same logits, step by step.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import Seq2SeqLMOutput

from couplet.kvcache import ATTENTION_NAME, recording_sdpa_attention

MODEL_TYPE = "palm"  # config.json's model_type (PalmConfig.model_type)
MODELSCOPE_TYPE = "palm-v2"  # configuration.json's model.type (modelscope.metainfo.Models.palm)
WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")


def is_palm(folder: str | os.PathLike) -> bool:
    """A PALM checkpoint folder: its config.json says model_type palm, or ModelScope's configuration.json
    says palm-v2 (the hub's PALM folders carry both)."""
    folder = Path(folder)
    for name, read in (("config.json", lambda c: c.get("model_type")),
                       ("configuration.json", lambda c: (c.get("model") or {}).get("type"))):
        try:
            value = read(json.loads((folder / name).read_text(encoding="utf-8")))
        except (OSError, ValueError, AttributeError):
            continue
        if value in (MODEL_TYPE, MODELSCOPE_TYPE):
            return True
    return False


class _Slot(torch.nn.Module):
    """What transformers' attention functions read off the module that calls them."""

    is_causal = True

    def __init__(self, layer_idx: int | None) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # the recording attention scores this cache layer (None: cross-attention)


class PalmDecoderLM(torch.nn.Module):
    """PALM's encoder and decoder weights, run with transformers' caches. Called like a transformers
    encoder–decoder by `ModeSession` (`encoder_outputs`, `decoder_input_ids`, an `EncoderDecoderCache`)."""

    def __init__(self, palm: Any, symbols: dict[str, int]) -> None:
        super().__init__()
        self.palm = palm  # modelscope's AbsSummarizer: .bert (encoder), .decoder, .generator
        decoder = palm.decoder
        first = decoder.transformer_layers[0].self_attn
        # the decoder's shape: what the KV accounting (`KVGeometry.of`) and transformers' caches read
        self.config = PretrainedConfig.from_dict(dict(
            vocab_size=palm.vocab_size, hidden_size=first.model_dim, num_attention_heads=first.head_count,
            num_hidden_layers=decoder.num_layers, is_encoder_decoder=True, is_decoder=True,
            decoder_start_token_id=symbols["BOS"], bos_token_id=symbols["BOS"], eos_token_id=symbols["EOS"],
            pad_token_id=symbols["PAD"]))
        self.config._attn_implementation = "sdpa"
        self.symbols = symbols
        self.head_dim = first.dim_per_head
        self._slots = [_Slot(i) for i in range(decoder.num_layers)]
        self._cross = _Slot(None)
        # Each PALM decoder layer registers a 5000 × 5000 causal-mask buffer (25 MB in uint8) for its own
        # forward; this loop builds its masks with transformers' mask functions and never reads it.
        for layer in decoder.transformer_layers:
            layer.mask = torch.empty(0, dtype=torch.uint8)

    # ---- what the rest of the project asks of a model ----
    def get_encoder(self) -> Any:
        return self.palm.bert

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.palm.decoder.embeddings  # tied with the generator's output projection

    def set_attn_implementation(self, name: str) -> None:
        if name not in ("sdpa", ATTENTION_NAME):
            raise ValueError(f"PALM runs with SDPA attention only, not {name!r}")
        self.config._attn_implementation = name

    def get_memory_footprint(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.parameters(), *self.buffers()))

    # ---- the forward ----
    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, t, hidden) → (batch, heads, t, head_dim)."""
        return x.view(x.shape[0], x.shape[1], -1, self.head_dim).transpose(1, 2)

    def forward(self, encoder_outputs: Any, attention_mask: torch.Tensor | None, decoder_input_ids: torch.Tensor,
                cache: EncoderDecoderCache, decoder_attention_mask: torch.Tensor | None = None,
                use_cache: bool = True) -> Seq2SeqLMOutput:
        """One decoder forward over (batch, q) new tokens; logits (batch, q, vocab) are PALM's log-probs."""
        decoder = self.palm.decoder
        self_cache, cross = cache.self_attention_cache, cache.cross_attention_cache
        memory = encoder_outputs[0]  # (batch, source, hidden)
        b, q = decoder_input_ids.shape
        past = self_cache.get_seq_length()  # the logical length: positions survive eviction
        positions = torch.arange(past, past + q, device=decoder_input_ids.device)
        # PositionalEncoding.forward: embedding × √dim + the sinusoid at each token's position
        x = decoder.embeddings(decoder_input_ids) * math.sqrt(decoder.pos_emb.dim) + decoder.pos_emb.pe[0, positions]
        self_mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=decoder_attention_mask,
                                       cache=self_cache)
        cross_mask = create_bidirectional_mask(config=self.config, inputs_embeds=x, attention_mask=attention_mask,
                                               encoder_hidden_states=memory)
        fresh = cross.get_seq_length() == 0
        scaling = self.head_dim ** -0.5
        attention = recording_sdpa_attention if self.config._attn_implementation == ATTENTION_NAME \
            else sdpa_attention_forward
        for i, layer in enumerate(decoder.transformer_layers):  # TransformerDecoderLayer.forward, dropout off
            sa, ca = layer.self_attn, layer.context_attn
            h = layer.layer_norm_1(x)
            keys, values = self_cache.update(self._heads(sa.linear_keys(h)), self._heads(sa.linear_values(h)), i)
            out, _ = attention(self._slots[i], self._heads(sa.linear_query(h)), keys, values, self_mask,
                               scaling=scaling)
            x = sa.final_linear(out.reshape(b, q, -1)) + x
            h = layer.layer_norm_2(x)
            if fresh:  # the encoder's memory, projected once per request
                mk, mv = cross.update(self._heads(ca.linear_keys(memory)), self._heads(ca.linear_values(memory)), i)
            else:
                held: Any = cross.layers[i]  # a DynamicLayer
                mk, mv = held.keys, held.values
            out, _ = sdpa_attention_forward(self._cross, self._heads(ca.linear_query(h)), mk, mv, cross_mask,
                                            scaling=scaling, is_causal=False)
            x = layer.feed_forward(ca.final_linear(out.reshape(b, q, -1)) + x)
        return Seq2SeqLMOutput(logits=self.palm.generator(decoder.layer_norm(x)))


@contextmanager
def _bert_from_palm_config() -> Iterator[None]:
    """ModelScope builds PALM's encoder with `BertConfig.from_pretrained` on PALM's own config.json, and
    transformers warns that the model type is palm, not bert — as intended here: silenced while it builds."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


SPECIALS = ("[PAD]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "，")  # what PALM's symbols use
# BERT-base's encoder and PalmConfig's own defaults for the decoder (12 layers, 768 wide, 8 heads): the base size
BASE_SHAPE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                  dec_layers=12, dec_hidden_size=768, dec_heads=8, dec_ff_size=3072)


def save_random_palm(path: str | os.PathLike, chars: list[str], shape: dict[str, int], seed: int = 0) -> Path:
    """A PALM folder laid out as ModelScope ships one — config.json (the BERT encoder's fields and PALM's),
    configuration.json, vocab.txt, pytorch_model.bin — with random weights from ModelScope's own classes.
    For tests and for memory/throughput at a real shape without a download (`scripts/random_checkpoint.py`)."""
    from modelscope.models.nlp.palm_v2 import PalmConfig, PalmForTextGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = [*SPECIALS, *(c for c in chars if c not in SPECIALS)]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    config = dict(model_type=MODEL_TYPE, encoder="zh_bert", encoder_pth="", max_pos=512, vocab_size=len(vocab),
                  max_position_embeddings=512, type_vocab_size=2, pad_token_id=0, **shape)
    (path / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (path / "configuration.json").write_text(json.dumps(
        {"framework": "pytorch", "task": "text-generation", "model": {"type": MODELSCOPE_TYPE}}), encoding="utf-8")
    cfg = PalmConfig.from_json_file(str(path / "config.json"))
    cfg.encoder_pth = str(path)
    torch.manual_seed(seed)
    with _bert_from_palm_config():
        state = PalmForTextGeneration(cfg).palm.state_dict()
    torch.save({k: v for k, v in state.items() if not k.endswith(".mask")}, path / "pytorch_model.bin")
    return path


def _refuse_weights(weights: str | None) -> None:
    if weights is not None:
        raise ValueError(f"PALM 不支持 --weights {weights}：bitsandbytes 经 transformers 的 from_pretrained 量化权重，"
                         "而 PALM 由 ModelScope 自己的类加载；请去掉 --weights（GPU 上可用 --dtype float16）。 "
                         f"(--weights {weights}: PALM loads through ModelScope's own classes, not transformers' "
                         "from_pretrained, which is where bitsandbytes quantizes)")


def load_palm(folder: str, device: str, dtype: torch.dtype, weights: str | None = None) -> tuple[PalmDecoderLM, Any]:
    """(the model, its BertTokenizer) from a PALM folder, through ModelScope's classes. The checkpoint is
    read onto the CPU first (`map_location`: a checkpoint saved on a GPU loads anywhere), unlike
    `PalmPreTrainedModel._from_pretrained`, which also cannot take a dtype."""
    _refuse_weights(weights)
    from modelscope.models.nlp.palm_v2 import PalmConfig, PalmForTextGeneration

    config = PalmConfig.from_json_file(os.path.join(folder, "config.json"))
    config.encoder_pth = os.path.join(folder, config.encoder_pth)  # as ModelScope's loader does
    if config.encoder not in ("bert", "zh_bert"):
        raise ValueError(f"PALM 的编码器「{config.encoder}」暂不支持：中文 PALM 用 BERT 词表（encoder 为 bert 或 "
                         "zh_bert）。 "
                         f"(PALM encoder {config.encoder!r} is not wired in: Chinese PALM uses a BERT vocabulary)")
    checkpoint = None
    for name in WEIGHT_FILES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                checkpoint = load_file(path)
            else:
                checkpoint = torch.load(path, map_location="cpu", weights_only=True)
            break
    if checkpoint is None:
        raise ValueError(f"PALM 文件夹「{folder}」里没有权重（{' 或 '.join(WEIGHT_FILES)}）。 "
                         f"(no PALM weights in {folder})")
    with _bert_from_palm_config():
        wrapper = PalmForTextGeneration(config, checkpoint)
    # ModelScope loads with strict=False: a checkpoint of another shape would leave random weights, silently
    keys = set(wrapper.palm._unwrap_checkpoint(checkpoint))
    missing = [k for k, _ in wrapper.palm.named_parameters() if k not in keys]
    if missing:
        raise ValueError(f"PALM 权重与配置不符：缺少 {len(missing)} 个参数（如 {', '.join(missing[:3])}）。 "
                         f"(the PALM checkpoint in {folder} lacks {len(missing)} of the model's parameters)")
    model = PalmDecoderLM(wrapper.palm, dict(wrapper.symbols))
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, wrapper.tokenizer


@torch.no_grad()
def palm_reference_logits(model: PalmDecoderLM, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          target: list[int]) -> torch.Tensor:
    """PALM's own decoder (its dict cache, as its `Translator` drives it) fed `target` one token at a time:
    (len(target), vocab) log-probs. The reference the tests hold `PalmDecoderLM` to."""
    from modelscope.models.nlp.palm_v2.text_generation import TransformerDecoderState

    palm = model.palm
    memory = palm.bert(input_ids, attention_mask, return_dict=False)[0]
    state = TransformerDecoderState(input_ids, palm.decoder.num_layers)
    # PALM's layers read their causal-mask buffer on every call (a one-token step needs 1 × 1 of it)
    for layer in palm.decoder.transformer_layers:
        layer.mask = torch.zeros(1, len(target), len(target), dtype=torch.uint8, device=input_ids.device)
    rows = []
    try:
        for step, token in enumerate(target):
            out, _, state = palm.decoder(state, torch.tensor([[token]], device=input_ids.device), memory, step=step)
            rows.append(palm.generator(out[:, -1]))
    finally:
        for layer in palm.decoder.transformer_layers:
            layer.mask = torch.empty(0, dtype=torch.uint8)
    return torch.cat(rows)

