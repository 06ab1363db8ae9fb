"""The festive voice and the long prompt: lexicon, exemplar store and retrieval, house prefix, copy ban,
taboo ban, 对下联, and the evaluation's voice figures — on the real embedded model and the real store."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from couplet.bench.figures import copies, round2_flags, template_repeat, voice_report
from couplet.events import CoupletResult
from couplet.models.tokenizer import prompt_ids
from couplet.serving.generate import CoupletRequest, generate, prepare
from couplet.training.corpus import Pair, is_heldout
from couplet.writing.constraints import COPY_RUN, LineConstraints, copy_runs
from couplet.writing.exemplars import MAX_PAIRS, STORE, load_store, read_store
from couplet.writing.folk import FOLK_ROUND2, load_folk
from couplet.writing.lexicon import NEGATION, TABOO, VoiceConfig, is_gloomy, style_of
from couplet.writing.placement import Placement
from couplet.writing.prompt import HOUSE_COUPLETS, PromptConfig, build_context
from couplet.writing.rules import check_couplet

ROOT = Path(__file__).resolve().parent.parent


def test_lexicon_buckets_and_voice_validation():
    assert style_of("天增岁月人增寿春满乾坤福满门") == "festive"
    assert style_of("青山横北郭白水绕东城") == "plain"
    assert style_of("春风不度玉门关") == "somber"
    assert style_of("万里悲秋常作客") == "taboo"
    assert is_gloomy("夕阳无限好") and not is_gloomy("春回大地千山秀")
    with pytest.raises(ValueError, match="penalty"):
        VoiceConfig(somber=1.0)
    with pytest.raises(ValueError, match="auspicious"):
        VoiceConfig(auspicious=9)


def test_store_is_small_parallel_and_never_held_out():
    assert STORE.stat().st_size <= 5 * 2**20
    pairs = read_store(STORE)
    assert 0 < len(pairs) <= MAX_PAIRS
    assert not [p for p in pairs if is_heldout(Pair(p[0], p[1], "lvshi_mid"))]
    assert all(len(u) == len(lo) in (5, 7) and style_of(u + lo) in ("festive", "plain") for u, lo in pairs)
    assert (STORE.parent / "README.md").exists()  # the source is credited beside the store


def test_retrieval_is_deterministic_shares_characters_and_excludes_the_pair():
    store = load_store()
    first = store.retrieve("龙马精神", 7)
    assert first == store.retrieve("龙马精神", 7) and len(first) == 6
    assert all(len(u) == 7 for u, _ in first)
    assert all(set("龙马精神") & set(u + lo) for u, lo in first)
    assert first[-1] != store.retrieve("吉祥如意", 7)[-1]
    best = first[-1]
    assert best not in store.retrieve("龙马精神", 7, exclude=best)
    # the query's own pair, when it is in the store, is the best match unless excluded (training)
    u, lo = read_store(STORE)[1234]
    assert store.retrieve(u, len(u), 1) == [(u, lo)]
    assert (u, lo) not in store.retrieve(u, len(u), 6, exclude=(u, lo))


def test_prompt_is_long_shared_and_fits_the_model(embedded_lm):
    assert len(HOUSE_COUPLETS) >= 12 and all(len(h.hengpi) == 4 for h in HOUSE_COUPLETS)
    tok = embedded_lm.tokenizer
    a, b = build_context(tok, "龙马精神", 7), build_context(tok, "吉祥如意", 7)
    ids_a = prompt_ids(tok, "龙马精神", 7, a.ids)
    assert 200 <= len(ids_a) <= 430
    assert len(ids_a) + 16 <= embedded_lm.model.config.max_position_embeddings
    # the same house prefix for everyone: the two prompts share it token for token
    shared = next(i for i, (x, y) in enumerate(zip(a.ids, b.ids, strict=False)) if x != y)
    assert shared >= 0.7 * len(ids_a)
    assert build_context(tok, "龙马精神", 7, PromptConfig(house=False, k=0)).ids == ()


def test_copy_runs_ban_the_fourth_character_of_a_borrowed_run(embedded_lm):
    runs = copy_runs(["春风送暖入屠苏"])
    assert runs["春风送"] == {"暖"} and runs["暖入屠"] == {"苏"}
    c = LineConstraints(embedded_lm.chars, Placement({}, {}), 7, borrowed=["春风送暖入屠苏"])
    allowed = c.allowed(0, COPY_RUN - 1, ["春风送", ""])
    assert not allowed[embedded_lm.vocab["暖"]] and allowed[embedded_lm.vocab["花"]]
    taboo = [embedded_lm.vocab[ch] for ch in TABOO if ch in embedded_lm.vocab]
    assert not c.allowed(0, 2, ["春风", ""])[taboo].any()
    assert LineConstraints(embedded_lm.chars, Placement({}, {}), 7, VoiceConfig(ban_taboo=False)).allowed(
        0, 2, ["春风", ""])[taboo].any()


def test_pair_bias_favours_the_upper_lines_class_and_the_contrasting_tone(embedded_lm):
    vocab = embedded_lm.vocab
    plain = LineConstraints(embedded_lm.chars, Placement({}, {}), 7,
                            VoiceConfig(somber=0, auspicious=0, pair_class=0, pair_tone=0))
    paired = LineConstraints(embedded_lm.chars, Placement({}, {}), 7,
                             VoiceConfig(somber=0, auspicious=0, pair_class=1.5, pair_tone=0.5))
    assert plain.bias_at(1, 0, ["青山横北郭白水", ""]) is None
    lines = ["青山横北郭白水", "绿"]  # position 1 of the 下联 mirrors 山 (山水 class, level tone)
    bias = paired.bias_at(1, 1, lines)
    assert bias[vocab["水"]] == pytest.approx(1.5 + 0.5)  # 山水 and oblique: both bonuses
    assert bias[vocab["海"]] == pytest.approx(1.5 + 0.5)  # oblique too
    assert bias[vocab["江"]] == pytest.approx(1.5)  # 山水, but level like 山
    assert bias[vocab["好"]] == pytest.approx(0.5)  # not classed; oblique
    assert paired.bias_at(0, 1, lines) is None  # the 上联 is not biased
    # the last position's tone is a hard rule already: no tone bonus there
    assert paired.bias_at(1, 6, lines)[vocab["好"]] == 0


def test_echo_favours_the_requests_own_exemplars_but_not_its_keywords(embedded_lm):
    vocab = embedded_lm.vocab
    c = LineConstraints(embedded_lm.chars, Placement({0: "春"}, {}), 7, VoiceConfig(somber=0, auspicious=0, echo=1.0),
                        echo_from=["春江花月夜", "秋水共长天"])
    bias = c.bias_at(0, 1, ["春", ""])
    assert bias[vocab["江"]] == bias[vocab["天"]] == 1.0
    assert bias[vocab["春"]] == 0 and bias[vocab["山"]] == 0


@pytest.mark.parametrize("field", ["pair_class", "pair_tone", "echo"])
def test_voice_bonuses_are_validated(field):
    with pytest.raises(ValueError, match=field):
        VoiceConfig(**{field: -1.0})


PHRASES = ["龙马精神", "五谷丰登", "春满乾坤", "新年快乐", "天增岁月", "生意兴隆", "步步高升", "福寿双全"]


def test_real_model_writes_festive_uncopied_couplets(embedded_lm):
    results = [generate(embedded_lm, CoupletRequest(p)) for p in PHRASES]
    for r in results:
        assert r.checks["passed"], (r.upper, r.lower, r.checks["failures"])
        assert not set(r.upper + r.lower) & TABOO
        assert len(r.exemplars) == 6 and not copies(r)
    report = voice_report(results)
    assert report["taboo_rate"] == 0 and report["copy_rate"] == 0
    assert report["negation_rate"] <= 0.25


def test_keywords_with_a_listed_character_still_work(embedded_lm):
    r = generate(embedded_lm, CoupletRequest("自强不息"))
    assert r.checks["passed"] and r.upper.startswith("自强") and r.lower.startswith("不息")
    assert sum(c in NEGATION for c in r.upper + r.lower) == 1  # the keyword's 不, and no other negation


@pytest.mark.parametrize("upper", ["春回大地千山秀", "白日依山尽", "江涵一镜净", "春风送暖千家福"])
def test_duixia_keeps_every_rule(embedded_lm, upper):
    prep = prepare(embedded_lm, CoupletRequest("", upper=upper, task="duixia"))
    assert prep.length == len(upper) and prep.keyword_text == ""
    r = generate(embedded_lm, CoupletRequest("", upper=upper, task="duixia"))
    assert r.upper == upper and len(r.lower) == len(upper)
    assert r.checks["passed"], r.checks["failures"]
    assert not set(r.lower) & set(upper)  # never the same character, at the same position or elsewhere
    if upper.endswith("福"):  # 福 is level (平) in modern Mandarin: said so, and the 下联 ends oblique (仄)
        assert any("平声" in n for n in r.notes) and r.checks["tones"]["lower_last"] == "仄"
    else:
        assert r.checks["tones"]["lower_last"] == "平"


def test_cli_duixia_and_its_bad_input():
    ok = subprocess.run([sys.executable, "-m", "couplet", "--upper", "春回大地千山秀", "--json"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["upper"] == "春回大地千山秀" and len(out["lower"]) == 7 and out["checks"]["passed"]
    assert len(out["exemplars"]) == 6
    bad = subprocess.run([sys.executable, "-m", "couplet", "--upper", "春风"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "上联须为 5 字或 7 字" in bad.stderr


def _result(upper: str, lower: str, keywords: str = "", exemplars=()) -> CoupletResult:
    return CoupletResult(keywords, upper, lower, "万象更新", "full", check_couplet(upper, lower, "", keywords),
                         exemplars=[list(p) for p in exemplars])


def test_voice_figures_count_what_the_model_chose():
    a = _result("龙马不知天地近", "精神无限岁华新", "龙马精神")
    b = _result("五福不知天地近", "临门春色万家新", "五福临门")
    c = _result("吉祥花开春满院", "如意燕舞福盈门", "吉祥如意")
    assert template_repeat([a, b, c]) == pytest.approx(2 / 3)  # 「不知天地近」 is shared by a and b
    # two phrases that share the keyword run 一帆风顺 and nothing else: keyword runs aside
    assert template_repeat([_result("一帆风顺春常在", "吉祥如意福满门", "一帆风顺吉祥如意"),
                            _result("一帆风顺花似锦", "万事亨通岁华新", "一帆风顺万事亨通")]) == 0
    report = voice_report([a, b, c])
    assert report["negation_rate"] == pytest.approx(2 / 3) and report["taboo_rate"] == 0
    assert voice_report([_result("自强不息春常在", "奋发有为福满门", "自强不息")])["negation_rate"] == 0
    assert copies(_result("春风送暖千家福", "瑞雪迎春万户欢", exemplars=[("春风送暖入屠苏", "爆竹声中一岁除")]))
    assert not copies(_result("春风送彩千村秀", "丽日临窗百业兴", exemplars=[("春风送暖入屠苏", "爆竹声中一岁除")]))
    assert copies(_result("春回大地千山秀", "丽日临窗百业兴"))  # a house line
    folk = load_folk()[0]  # a line of the project's own 春联: trained on, so a copy even when not in the prompt
    assert copies(_result(folk.upper, "丽日临窗百业兴"[: len(folk.upper)]))
    # the second round is trained on but not banned: counted apart, as a recitation check, and not a copy
    filler = "丽日临窗百业兴"
    second = next(row for row in load_folk(FOLK_ROUND2) if not copies(_result(row.upper, filler[: len(row.upper)])))
    recited = _result(second.upper, filler[: len(second.upper)])
    assert round2_flags([recited, c]) == [True, False]
    assert round2_flags([_result(second.upper, filler[: len(second.upper)], second.upper)]) == [False]  # keywords
    given = _result(second.upper, filler[: len(second.upper)])  # 对下联: the visitor's 上联 is not the model's
    given.checks["given_upper"] = True
    assert round2_flags([given]) == [False]


def test_store_readme_names_the_builder():
    text = (STORE.parent / "README.md").read_text(encoding="utf-8")
    assert "python -m couplet.writing.exemplars build" in text and "chinese-poetry" in text
    with lzma.open(STORE, "rt", encoding="utf-8") as f:
        assert f.readline().strip() == "upper\tlower"
