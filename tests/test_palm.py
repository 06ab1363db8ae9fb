"""ModelScope's PALM 2.0, the source article's model (`couplet.models.palm`): a tiny random PALM built with ModelScope's
own classes, put where ModelScope's client caches a download, and loaded as `modelscope:ORG/NAME` through
the real client (offline: the cache is all it reads). Our loop's decoder matches PALM's own, logit for logit;
it writes structurally valid couplets from keywords and 对下联 in every mode it supports, with exact
accounting, and refuses prefix sharing with the reason. No mocks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_model import TINY_CHARS

from couplet.kvcache import MODE_INFO, MODES, make_mode
from couplet.models.loading import load_model
from couplet.models.palm import save_random_palm
from couplet.serving.generate import CoupletRequest, Decoding, generate, prepare

HUB_ID = "damo/nlp_palm2.0_text-generation_chinese-base"  # the article's model, as ModelScope names it
DEC_LAYERS, DEC_HIDDEN = 2, 32
TINY_SHAPE = dict(hidden_size=DEC_HIDDEN, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  dec_layers=DEC_LAYERS, dec_hidden_size=DEC_HIDDEN, dec_heads=4, dec_ff_size=64)


@pytest.fixture(scope="module")
def palm_folder(tmp_path_factory) -> Path:
    return save_random_palm(tmp_path_factory.mktemp("palm"), TINY_CHARS, TINY_SHAPE)


@pytest.fixture(scope="module")
def palm_lm(palm_folder, tmp_path_factory):
    """Loaded as `modelscope:…` from ModelScope's own cache layout (models/ORG--NAME/snapshots/master)."""
    cache = tmp_path_factory.mktemp("modelscope-cache")
    shutil.copytree(palm_folder, cache / "models" / HUB_ID.replace("/", "--") / "snapshots" / "master")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELSCOPE_CACHE", str(cache))
        return load_model(f"modelscope:{HUB_ID}", device="cpu", dtype="float32")


def test_palm_loads_through_the_modelscope_client_as_its_own_family(palm_lm):
    family = palm_lm.family
    assert family.name == "palm" and family.encoder_decoder and "snapshots" in palm_lm.source
    vocab = palm_lm.tokenizer.get_vocab()
    assert family.start == vocab["[CLS]"] and family.line_break == (vocab["，"],)
    # PALM's layers each register a 5000 × 5000 causal-mask buffer (25 MB); the loop does not use them
    assert palm_lm.weight_bytes < 2_000_000


def test_the_decoder_matches_palms_own_logit_for_logit(palm_lm):
    """The same log-probs as PALM's decoder with its dict cache (as its Translator drives it): one token per
    forward, and with two tokens in one forward (the line break rides along with the last 上联 character)."""
    from couplet.models.palm import palm_reference_logits

    tok, model = palm_lm.tokenizer, palm_lm.model
    enc = tok("春风明月水", return_tensors="pt")
    target = [palm_lm.family.start, *tok.convert_tokens_to_ids(list("春和景明")), *palm_lm.family.line_break]
    reference = palm_reference_logits(model, enc["input_ids"], enc["attention_mask"], target)
    for feeds in ([[t] for t in target], [target[:1], target[1:3], target[3:]]):
        with make_mode("full").new_session(model) as session:
            session.set_encoder(model.get_encoder()(**enc), enc["attention_mask"])
            ours = torch.cat([session.forward(torch.tensor([f]))[0] for f in feeds])
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", list(MODES))
def test_palm_writes_from_keywords_and_duixia_in_every_mode_or_says_why(palm_lm, mode):
    parts = make_mode(mode).compose()
    refusal = palm_lm.family.mode_refusal(mode)
    keywords = CoupletRequest("春风", seed=1, temperature=0.7)
    duixia = CoupletRequest("", upper="春风明月水", task="duixia")
    if parts.sharing is not None or mode == "snapkv":  # the decoder's prompt is one start token: nothing to
        assert refusal is not None and ("共享" in refusal or "只压缩提示" in refusal)  # share, nor to prune
        with pytest.raises(ValueError, match="不支持"):
            generate(palm_lm, keywords, mode)
        return
    assert refusal is None  # absolute positions: eviction is safe, unlike T5's relative bias
    per_token = 2 * DEC_LAYERS * DEC_HIDDEN * 4  # K and V, the decoder's layers, all heads, float32
    r = generate(palm_lm, keywords, mode)
    assert r.checks["passed"], (r.upper, r.lower, r.checks["failures"])
    assert r.upper.startswith("春") and r.lower.startswith("风") and len(r.upper) == len(r.lower) == 7
    last = r.steps[-1]
    fed = 1 + 7 + 1 + 6  # [CLS], 上联, "，", 下联 but its last character (the keywords are the encoder's)
    assert last.logical_length == fed and last.full_equivalent_bytes == fed * per_token
    if MODE_INFO[mode].lossless:
        assert r.peak_bytes == r.full_equivalent_bytes
    else:
        assert r.peak_bytes < r.full_equivalent_bytes
    if parts.retention is not None:
        assert last.stored_tokens < last.logical_length
    r = generate(palm_lm, duixia, mode)
    assert r.upper == "春风明月水" and len(r.lower) == 5 and r.checks["passed"], r.checks["failures"]
    assert r.steps[-1].logical_length == 1 + 4  # [CLS] and the 下联 but its last character: no 上联 fed


def test_a_row_does_not_depend_on_its_batch(palm_lm):
    """Keywords of different lengths: the encoder's inputs are right-padded in one batch, and the
    cross-attention mask hides the padding — each row writes what it writes alone."""
    requests = [CoupletRequest("春风"), CoupletRequest("龙马精神"), CoupletRequest("福")]
    alone = [generate(palm_lm, r, "int8") for r in requests]
    decoding = Decoding(palm_lm, [prepare(palm_lm, r) for r in requests], "int8")
    decoding.prefill()
    while not decoding.done:
        out = decoding.step()
    for progress, single in zip(out, alone, strict=True):
        assert progress.result is not None
        assert (progress.result.upper, progress.result.lower) == (single.upper, single.lower)


def test_a_wrong_checkpoint_and_weight_quantization_are_refused_with_the_reason(palm_folder, tmp_path):
    from couplet.models.palm import load_palm

    with pytest.raises(ValueError, match="PALM 不支持 --weights nf4"):
        load_palm(str(palm_folder), "cuda", torch.float16, "nf4")
    broken = shutil.copytree(palm_folder, tmp_path / "broken")
    state = torch.load(broken / "pytorch_model.bin", weights_only=True)
    torch.save({k: v for k, v in state.items() if not k.startswith("decoder.")}, broken / "pytorch_model.bin")
    with pytest.raises(ValueError, match="PALM 权重与配置不符"):  # ModelScope alone would load random weights
        load_model(str(broken), device="cpu")


def test_the_cli_writes_a_lower_line_with_palm(palm_folder):
    env = {**os.environ, "COUPLET_MODEL": str(palm_folder)}
    cli = subprocess.run([sys.executable, "-m", "couplet", "--upper", "春风明月水", "--mode", "window", "--json",
                          "--device", "cpu"], capture_output=True, text=True, check=False, env=env)
    assert cli.returncode == 0, cli.stderr
    out = json.loads(cli.stdout)
    assert out["upper"] == "春风明月水" and len(out["lower"]) == 5 and out["checks"]["passed"]


def test_the_engine_serves_keywords_and_duixia_side_by_side(palm_lm):
    """Requests of both tasks at once: an encoder–decoder's waves each hold one task (a 对下联 row feeds no
    上联), and every request writes what it writes alone."""
    from couplet.serving.engine import Engine, EngineConfig

    requests = [CoupletRequest("春风"), CoupletRequest("", upper="春回大地千山秀", task="duixia"),
                CoupletRequest("龙马精神"), CoupletRequest("", upper="福满人间喜气多", task="duixia")]
    with Engine(palm_lm, EngineConfig(kv_budget_mb=8, pool_mb=1)) as engine:
        tickets = [engine.submit(r, "window") for r in requests]
        results = [list(t)[-1].result for t in tickets]
        with pytest.raises(ValueError, match="不支持「combo」"):  # refused at the door, with the reason
            engine.submit(requests[0], "combo")
        assert engine.stats().reserved_bytes == 0
    for request, r in zip(requests, results, strict=True):
        alone = generate(palm_lm, request, "window")
        assert r is not None and (r.upper, r.lower) == (alone.upper, alone.lower) and r.checks["passed"]
