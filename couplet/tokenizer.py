"""Character-level tokenizer and the prompt format the embedded model is trained on.

The tokenizer is a `tokenizers` WordLevel model with a split-every-character pre-tokenizer, wrapped in
transformers' `PreTrainedTokenizerFast`, so it saves and loads through `AutoTokenizer` like any hub one.

Sequence format (one couplet, one token per character)::

    <bos> <L7> 龙 精 <sep> 龙 马 … 客 <mid> 精 神 … 仙 <eos>
          │    └ keywords, in order (0-8) ┘ └── upper (上联) ──┘      └── lower (下联) ─┘
          └ length tag: <L5> or <L7>

The loss covers everything after <sep>: the two lines, <mid> and <eos>.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, UNK, BOS, EOS, SEP, MID = "<pad>", "<unk>", "<bos>", "<eos>", "<sep>", "<mid>"
LENGTH_TAGS = {5: "<L5>", 7: "<L7>"}
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS, SEP, MID, *LENGTH_TAGS.values()]


def build_tokenizer(char_counts: Counter[str], vocab_size: int,
                    must_include: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """Most frequent characters up to `vocab_size` (specials included), plus `must_include`."""
    chars = [c for c, _ in char_counts.most_common(vocab_size - len(SPECIAL_TOKENS))]
    seen = set(chars)
    chars += sorted({c for c in "".join(must_include) if c not in seen})
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Special tokens are matched before pre-tokenization; everything else becomes one token per character.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+|."), behavior="isolated")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD, sep_token=SEP,
        additional_special_tokens=[MID, *LENGTH_TAGS.values()],
        padding_side="left",
        model_max_length=64,
    )
    return tok


@dataclass(frozen=True)
class FormatIds:
    """Ids of the format's special tokens, looked up once per tokenizer."""

    pad: int
    unk: int
    bos: int
    eos: int
    sep: int
    mid: int
    length: dict[int, int]

    @classmethod
    def of(cls, tok: PreTrainedTokenizerBase) -> FormatIds:
        v = _vocab(tok)
        return cls(pad=v[PAD], unk=v[UNK], bos=v[BOS], eos=v[EOS], sep=v[SEP], mid=v[MID],
                   length={n: v[t] for n, t in LENGTH_TAGS.items()})


@lru_cache(maxsize=8)
def _vocab(tok: PreTrainedTokenizerBase) -> dict[str, int]:
    """`get_vocab()` rebuilds a dict on every call (~1 ms for 7k entries): once per tokenizer is enough."""
    return tok.get_vocab()


def char_ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    """One id per character; unknown characters map to <unk> (callers report them)."""
    vocab = _vocab(tok)
    unk = vocab[UNK]
    return [vocab.get(c, unk) for c in text]


def prompt_ids(tok: PreTrainedTokenizerBase, keywords: str, length: int) -> list[int]:
    """`<bos> <Ln> keywords <sep>`: the shared prompt every couplet starts from."""
    f = FormatIds.of(tok)
    return [f.bos, f.length[length], *char_ids(tok, keywords), f.sep]


def upper_start(keywords: str) -> int:
    """Index of the first 上联 token in `couplet_ids`: after `<bos> <Ln> keywords <sep>`."""
    return len(keywords) + 3


def couplet_ids(tok: PreTrainedTokenizerBase, keywords: str, upper: str, lower: str) -> list[int]:
    """The whole training sequence for one pair."""
    f = FormatIds.of(tok)
    return [*prompt_ids(tok, keywords, len(upper)), *char_ids(tok, upper), f.mid, *char_ids(tok, lower), f.eos]
