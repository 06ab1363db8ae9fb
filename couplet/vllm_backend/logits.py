"""The couplet rules inside a vLLM server: a logits processor loaded with
`--logits-processors couplet.vllm_backend.logits:CoupletLogitsProcessor` (scripts/vllm_serve.sh passes it, with
this repository on PYTHONPATH). A request that carries `vllm_xargs={"couplet": RowSpec JSON}` is decoded under
the rules (`couplet.vllm_backend.logit_rules.RowRules`); any other request passes untouched.

This is vLLM's V1-model-runner interface (`vllm.v1.sample.logits_processor`), the one its CPU build runs. vLLM's
docs say its V2 model runner on GPU takes a different logits-processor interface: on a GPU start the server with
`VLLM_USE_V2_MODEL_RUNNER=0` (scripts/vllm_serve.sh does), and note that this path is untested on a GPU here.

Why a processor and not `allowed_token_ids`: the allowed set changes with every character written (no repeats,
no copied run, the end tone, the 下联 against the 上联), and `allowed_token_ids` is fixed per request — the
client would have to send one request per character, each re-reading the prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from transformers import AutoTokenizer
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor  # type: ignore[import-not-found]

from couplet.vllm_backend.logit_rules import SPEC_KEY, RowRules, RowSpec
from couplet.writing.vocab import CharVocab

logger = logging.getLogger("couplet.serving")


class CoupletLogitsProcessor(AdapterLogitsProcessor):  # type: ignore[misc]
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        model_config = vllm_config.model_config
        self._tokenizer_path = model_config.tokenizer
        self._size = int(model_config.get_vocab_size())
        self._tables: dict[bool, CharVocab] = {}
        eos = getattr(model_config.hf_config, "eos_token_id", None)
        self._eos = int(eos[0] if isinstance(eos, list) else eos or 0)

    def _chars(self, byte_level: bool) -> CharVocab:
        if byte_level not in self._tables:  # once per server (the tokenizer is read once, on the first request)
            tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_path)
            self._tables[byte_level] = CharVocab.of(tokenizer, byte_level, self._size)
        return self._tables[byte_level]

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        raw = (sampling_params.extra_args or {}).get(SPEC_KEY)
        if raw is not None:
            RowSpec.from_json(str(raw))  # ValueError → HTTP 400 with the reason

    def is_argmax_invariant(self) -> bool:
        return False  # it masks and biases: greedy picks change

    def new_req_logits_processor(self, params: Any) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        raw = (params.extra_args or {}).get(SPEC_KEY)
        if raw is None:
            return None
        # This runs inside the engine's step: nothing may raise here, or the server goes down for everyone. A
        # spec that passed validate_params but does not fit this vocabulary ends its request at once instead
        # (the client sees a short reply: 「回复无法解析」).
        try:
            spec = RowSpec.from_json(str(raw))
            chars = self._chars(spec.byte_level)
            if unknown := spec.unknown_to(chars):
                raise ValueError(", ".join(unknown))
            rules = RowRules(chars, spec)
        except Exception as e:  # noqa: BLE001 - see above
            logger.warning("couplet spec refused: %s", e)
            return self._end
        return partial(_guarded, rules, self._end)

    def _end(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        """Only the end-of-sequence token: the request stops here."""
        out = torch.full_like(logits, float("-inf"))
        out[self._eos] = 0.0
        return out


def _guarded(rules: RowRules, end: Callable, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    try:
        return rules(output_ids, logits)
    except Exception as e:  # noqa: BLE001 - never raise inside the engine's step (see new_req_logits_processor)
        logger.warning("couplet rules failed: %s", e)
        return end(output_ids, logits)
