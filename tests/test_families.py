"""Model families (`couplet.models.families`): the embedded format, and a GPT-2 couplet model with a BERT vocabulary
(the uer/gpt2-chinese-couplet layout) built here at random — loaded through the same path as a hub model,
writing structurally valid couplets (the constraints hold even with random weights) in every mode, with
exact byte accounting. Families not wired in are refused with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model import TINY_CHARS

from couplet.kvcache import MODE_INFO, MODES, PrefixPool
from couplet.models.families import UnsupportedFamily, detect, parse_reply
from couplet.models.loading import UnsupportedModel, load_model
from couplet.serving.generate import CoupletRequest, generate, prepare

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
        detect(tok, "bart")
    with pytest.raises(UnsupportedFamily, match="llama"):  # a plain decoder: no couplet format, no chat template
        detect(tok, "llama")
    tok.chat_template = "{{ messages }}"
    assert detect(tok, "llama").name == "chat"
    no_line_break = make_gpt2_couplet(tmp_path / "h", specials=[t for t in BERT_SPECIALS if t != "-"])
    with pytest.raises(UnsupportedModel, match="暂不支持"):
        load_model(str(no_line_break), device="cpu")


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_chat_model(path: Path, seed: int = 0) -> Path:
    """A Qwen2 with a byte-level BPE vocabulary and a ChatML template (the Qwen2.5-Instruct layout), trained
    here on a little text so that the test characters are single tokens; random weights."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from couplet.models.families import SYSTEM_RULES
    from couplet.writing.prompt import HOUSE_COUPLETS

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = list(TINY_CHARS) * 30 + [SYSTEM_RULES, "上联：下联：横批：参考古联请以为关键词写一副七言五言春联对"] + [
        f"{h.upper} {h.lower} {h.hengpi}" for h in HOUSE_COUPLETS]
    core.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def chat_lm(tmp_path_factory):
    return load_model(str(make_chat_model(tmp_path_factory.mktemp("chat"))), device="cpu", dtype="float32")


def test_a_chat_model_is_prompted_through_its_template(chat_lm):
    family = chat_lm.family
    assert family.name == "chat" and family.byte_level and family.uses_context
    assert set(TINY_CHARS) <= set(chat_lm.vocab)  # byte-level tokens decoded: one id per character
    prep = prepare(chat_lm, CoupletRequest("春风"))
    text = chat_lm.tokenizer.decode(prep.prompt)
    assert text.startswith("<|im_start|>system\n你是春联作者") and "本店春联" in text and "天增岁月人增寿" in text
    assert "参考古联" in text and "请以「春风」为关键词" in text and text.endswith("<|im_start|>assistant\n上联：")
    assert chat_lm.tokenizer.decode(list(family.line_break)) == "\n下联："
    # the system message (rules and house couplets) is the prefix every visitor shares
    other = prepare(chat_lm, CoupletRequest("明月"))
    shared = family.shared_prefix(prep.context.house)
    assert shared > 100 and prep.prompt[:shared] == other.prompt[:shared]
    duixia = prepare(chat_lm, CoupletRequest("", upper="春风明月水", task="duixia"))
    assert "请为上联「春风明月水」对下联" in chat_lm.tokenizer.decode(duixia.prompt)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_chat_model_writes_a_well_formed_couplet_in_every_mode(chat_lm, mode):
    pool = PrefixPool()
    for keywords in ("春风", "明月"):  # the second visitor finds the shared system prefix in the pool
        r = generate(chat_lm, CoupletRequest(keywords, length=5), mode, pool)
        assert r.checks["passed"], (r.upper, r.lower, r.checks["failures"])
        assert r.upper.startswith(keywords[0]) and r.lower.startswith(keywords[1])
        reply = chat_lm.tokenizer.decode(chat_lm.char_ids(r.upper) + list(chat_lm.family.line_break)
                                         + chat_lm.char_ids(r.lower))
        assert parse_reply("上联：" + reply)[:2] == (r.upper, r.lower)
    assert pool.total_refs() == 0


@pytest.mark.parametrize(("reply", "parsed"), [
    ("上联：春风送暖千家福\n下联：瑞雪迎春万户欢\n横批：四季平安", ("春风送暖千家福", "瑞雪迎春万户欢", "四季平安")),
    ("好的！上联: 春风送暖千家福，下联: 瑞雪迎春万户欢。", ("春风送暖千家福", "瑞雪迎春万户欢", "")),
])
def test_parse_reply_reads_free_form_answers(reply, parsed):
    assert parse_reply(reply) == parsed


def test_parse_reply_refuses_a_malformed_answer():
    with pytest.raises(ValueError, match="malformed"):
        parse_reply("新年快乐！")


def make_t5_couplet(path: Path, seed: int = 0) -> Path:
    """A T5 with a BERT vocabulary (the shibing624/t5-chinese-couplet layout: input `对联：` + 上联), random."""
    import torch
    from transformers import BertTokenizer, T5Config, T5ForConditionalGeneration

    vocab = [*BERT_SPECIALS, "对", "联", "：", *TINY_CHARS]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizer(str(path / "vocab.txt")).save_pretrained(path)
    torch.manual_seed(seed)
    # a decoder shallower than the encoder, and d_kv != d_model / heads: the cache geometry is the decoder's
    config = T5Config(vocab_size=len(vocab), d_model=32, d_kv=6, d_ff=64, num_layers=2, num_decoder_layers=1,
                      num_heads=4, pad_token_id=0, decoder_start_token_id=vocab.index("[CLS]"),
                      eos_token_id=vocab.index("[SEP]"))
    T5ForConditionalGeneration(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def t5_couplet(tmp_path_factory):
    return load_model(str(make_t5_couplet(tmp_path_factory.mktemp("t5"))), device="cpu", dtype="float32")


@pytest.mark.parametrize("mode", list(MODES))
def test_a_t5_couplet_model_writes_the_lower_line_or_says_why_not(t5_couplet, mode):
    family = t5_couplet.family
    assert family.name == "t5-couplet" and family.encoder_decoder
    request = CoupletRequest("", upper="春风明月水", task="duixia")
    refusal = family.mode_refusal(mode)
    if refusal is not None:
        assert "逐出" in refusal or "共享" in refusal  # it says why: eviction, or nothing to share
        with pytest.raises(ValueError, match="不支持"):
            generate(t5_couplet, request, mode)
        return
    r = generate(t5_couplet, request, mode)
    assert r.upper == "春风明月水" and len(r.lower) == 5 and r.checks["passed"], r.checks["failures"]
    cfg = t5_couplet.model.config
    per_token = 2 * cfg.num_decoder_layers * cfg.num_heads * cfg.d_kv * 4
    last = r.steps[-1]
    assert last.logical_length == 1 + 4  # the start token and the 下联 but its last character: no 上联 fed
    assert last.full_equivalent_bytes == 5 * per_token
    assert r.peak_bytes <= r.full_equivalent_bytes


def test_a_t5_couplet_model_refuses_keywords_and_eviction_clearly(t5_couplet):
    from couplet.writing.text import CoupletInputError

    with pytest.raises(CoupletInputError, match="只会对下联"):
        generate(t5_couplet, CoupletRequest("春风"))
    assert "逐出" in t5_couplet.family.mode_refusal("selective")
    assert "共享" in t5_couplet.family.mode_refusal("shared")
    assert t5_couplet.family.mode_refusal("int4") is None


def test_the_t5_cache_geometry_is_the_decoders(t5_couplet):
    """What the engine admits by (`owned_peak_bytes`): the decoder's depth and T5's d_kv."""
    from couplet.kvcache.layer import KVGeometry

    geometry = KVGeometry.of(t5_couplet.model)
    assert (geometry.layers, geometry.kv_heads, geometry.head_dim) == (1, 4, 6)
