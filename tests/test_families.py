"""Model families (`couplet.families`): the embedded format, and a GPT-2 couplet model with a BERT vocabulary
(the uer/gpt2-chinese-couplet layout) built here at random — loaded through the same path as a hub model,
writing structurally valid couplets (the constraints hold even with random weights) in every mode, with
exact byte accounting. Families not wired in are refused with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model import TINY_CHARS

from couplet.families import UnsupportedFamily, detect
from couplet.generate import CoupletRequest, generate, prepare
from couplet.kvcache import MODE_INFO, MODES, PrefixPool
from couplet.model import UnsupportedModel, load_model

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "-", "，"]


def make_gpt2_couplet(path: Path, seed: int = 0, specials: list[str] = BERT_SPECIALS) -> Path:
    """GPT2LMHeadModel + BertTokenizer, the uer/gpt2-chinese-couplet layout, random weights, saved to `path`."""
    import torch
    from transformers import BertTokenizer, GPT2Config, GPT2LMHeadModel

    vocab = [*specials, *TINY_CHARS]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizer(str(path / "vocab.txt")).save_pretrained(path)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        bos_token_id=vocab.index("[CLS]"), eos_token_id=vocab.index("[SEP]"))
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt2_couplet(tmp_path_factory):
    return load_model(str(make_gpt2_couplet(tmp_path_factory.mktemp("gpt2-couplet"))), device="cpu",
                      dtype="float32")


def test_the_family_is_read_from_the_checkpoint(gpt2_couplet, tiny_lm):
    assert tiny_lm.family.name == "couplet" and tiny_lm.family.uses_context
    assert gpt2_couplet.family.name == "gpt2-couplet" and not gpt2_couplet.family.uses_context
    vocab = gpt2_couplet.tokenizer.get_vocab()
    assert gpt2_couplet.family.line_break == (vocab["-"],)
    prep = prepare(gpt2_couplet, CoupletRequest("春风"))
    assert prep.prompt == [vocab["[CLS]"]] and prep.context.ids == () and prep.keyword_positions == ()


@pytest.mark.parametrize("mode", list(MODES))
def test_a_gpt2_couplet_model_writes_in_every_mode_with_exact_accounting(gpt2_couplet, mode):
    pool = PrefixPool()
    r = generate(gpt2_couplet, CoupletRequest("春风", seed=1, temperature=0.7), mode, pool)
    assert r.checks["passed"], (r.upper, r.lower, r.checks["failures"])
    assert r.upper.startswith("春") and r.lower.startswith("风") and len(r.upper) == len(r.lower) == 7
    cfg = gpt2_couplet.model.config
    per_token = 2 * cfg.n_layer * cfg.n_embd * 4  # K and V, every layer, all heads, float32
    fed = 1 + 7 + 1 + 6  # [CLS], 上联, "-", 下联 but its last character
    last = r.steps[-1]
    assert last.logical_length == fed and last.full_equivalent_bytes == fed * per_token
    ratio = r.peak_bytes / r.full_equivalent_bytes
    assert ratio == 1.0 if MODE_INFO[mode].lossless else ratio <= 1.0
    assert pool.total_refs() == 0


def test_duixia_is_the_gpt2_couplet_models_native_task(gpt2_couplet):
    r = generate(gpt2_couplet, CoupletRequest("", upper="春风明月水", task="duixia"))
    assert r.upper == "春风明月水" and len(r.lower) == 5 and r.checks["passed"], r.checks["failures"]
    assert not set(r.lower) & set(r.upper)


def test_an_unknown_family_is_refused_with_the_reason(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(make_gpt2_couplet(tmp_path / "g"))
    with pytest.raises(UnsupportedFamily, match="暂不支持"):
        detect(tok, "t5")
    tok.chat_template = "{{ messages }}"
    with pytest.raises(UnsupportedFamily, match="chat/instruct"):
        detect(tok, "qwen2")
    no_line_break = make_gpt2_couplet(tmp_path / "h", specials=[t for t in BERT_SPECIALS if t != "-"])
    with pytest.raises(UnsupportedModel, match="暂不支持"):
        load_model(str(no_line_break), device="cpu")
