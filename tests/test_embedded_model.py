"""The real embedded model, loaded from assets/ through the Auto classes: well-formed couplets, the
tokenizer round trip, and the CLI as a user runs it (a real subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer, LlamaForCausalLM

from couplet.models.loading import EMBEDDED_MODEL
from couplet.serving.generate import CoupletRequest, generate
from couplet.writing.rules import check_couplet

ROOT = Path(__file__).resolve().parent.parent
KEYWORD_SETS = ["龙马精神", "吉祥如意", "五福临门", "春风", "明月", "梅花", "平安", "福", "山水", "读书",
                "国泰民安", "花开富贵"]


def test_checkpoint_is_a_standard_llama_with_gqa_and_rotary(embedded_lm):
    model = embedded_lm.model
    assert isinstance(model, LlamaForCausalLM)
    cfg = model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention
    assert cfg.rope_parameters["rope_type"] == "default"
    assert 3e6 < embedded_lm.parameters < 12e6
    size = (EMBEDDED_MODEL / "model.safetensors").stat().st_size
    assert size <= 20 * 1024 * 1024


def test_tokenizer_round_trip():
    tok = AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL))
    text = "龙马精神春满乾坤福满门"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.unk_token_id not in ids
    assert tok.decode(ids).replace(" ", "") == text
    special = tok("<bos><L7>春<sep>", add_special_tokens=False)["input_ids"]
    assert special[:2] == [tok.convert_tokens_to_ids("<bos>"), tok.convert_tokens_to_ids("<L7>")]


@pytest.mark.parametrize("keywords", KEYWORD_SETS)
def test_real_model_writes_well_formed_couplets(embedded_lm, keywords):
    r = generate(embedded_lm, CoupletRequest(keywords))
    assert r.checks["passed"], (r.upper, r.lower, r.checks["failures"])
    assert check_couplet(r.upper, r.lower, r.hengpi, keywords)["passed"]
    r5 = generate(embedded_lm, CoupletRequest(keywords, length=5, temperature=0.8, seed=1))
    assert len(r5.upper) == len(r5.lower) == 5 and r5.checks["passed"], r5.checks["failures"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "couplet", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_json_has_the_documented_fields():
    out = run_cli("龙马精神", "--json", "--seed", "3")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"keywords", "upper", "lower", "hengpi", "checks", "mode", "kv", "steps"} <= set(data)
    assert data["keywords"] == "龙马精神" and data["upper"].startswith("龙马") and data["lower"].startswith("精神")
    assert data["checks"]["passed"] and len(data["hengpi"]) == 4
    assert data["kv"]["peak_bytes"] == data["kv"]["full_equivalent_bytes"] > 0


def test_cli_several_modes_give_a_list_on_one_seed():
    out = run_cli("春风", "--json", "--mode", "full", "--mode", "int8", "--temperature", "0.7", "--seed", "2")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [d["mode"] for d in data] == ["full", "int8"]
    assert data[1]["kv"]["peak_bytes"] < data[0]["kv"]["peak_bytes"]


def test_cli_plain_text(capsys):
    """The plain-text output, in-process (`couplet.__main__.run`, the code a subprocess runs: the subprocess
    tests around it pay the interpreter's start and the imports, ~15 s each)."""
    from couplet.__main__ import run

    assert run(["吉祥如意", "--length", "5"]) == 0
    out = capsys.readouterr().out
    assert "上联：吉祥" in out and "下联：如意" in out and "横批：" in out and "检查：字数✓" in out


@pytest.mark.parametrize("args", [["hello"], [""], ["一二三四五六七八九"], ["春", "--mode", "nope"],
                                  ["春", "--set", "window.bogus=1", "--mode", "window"]])
def test_cli_bad_input_exits_nonzero_with_one_line(args):
    out = run_cli(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("错误")
