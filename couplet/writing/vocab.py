"""The character table a couplet is written with: {character: token id}, each id's character, and the ids of
single Han characters. Built from a tokenizer alone, so the decoding rules can run where the weights are not
loaded (inside a vLLM server: `couplet.vllm_backend.logits`), and shared by `LoadedModel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from couplet.writing.text import is_han


@dataclass(eq=False)  # hashable by identity: the constraint masks are cached per table
class CharVocab:
    vocab: dict[str, int]  # {text: id}
    id_to_char: list[str]  # text of every id the model can emit ("" for non-characters), as long as the logits
    han_ids: torch.Tensor  # (n,) long: ids of single Han characters, the only tokens a couplet line may contain

    @classmethod
    def of(cls, tokenizer, byte_level: bool, logits_size: int) -> CharVocab:
        """A character-level vocabulary (this project's, BERT's) is its own text; a byte-level BPE one (GPT-2,
        Qwen) stores bytes as symbols, so each token is decoded — a Han character that is one token then maps
        to its id (characters split over several tokens are left out: a couplet is one token per character).
        `logits_size`: the model's vocab_size (an embedding may be padded past the tokenizer)."""
        raw = tokenizer.get_vocab()
        if byte_level:
            vocab: dict[str, int] = {}
            for tok, i in sorted(raw.items(), key=lambda kv: kv[1]):
                text = tokenizer.convert_tokens_to_string([tok])
                if len(text) == 1 and text not in vocab:
                    vocab[text] = i
        else:
            vocab = raw
        chars = [""] * max(logits_size, max(raw.values()) + 1)
        for tok, i in vocab.items():
            chars[i] = tok
        han = torch.tensor([i for t, i in vocab.items() if len(t) == 1 and is_han(t)], dtype=torch.long)
        return cls(vocab, chars, han)
