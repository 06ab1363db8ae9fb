"""The project's own 春联 (`couplet.writing.folk`) and the 横批 scored as the couplet's continuation
(`couplet.writing.hengpi`)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from couplet.models.scoring import sequence_logprobs
from couplet.models.tokenizer import FormatIds, char_ids, entry_ids
from couplet.training.context import ContextSampler, ContextTrainConfig
from couplet.training.context import parse_args as parse_context_args
from couplet.training.corpus import Pair
from couplet.writing import hengpi
from couplet.writing.exemplars import load_store
from couplet.writing.folk import FOLK, FOLK_ROUND2, folk_lines, load_folk
from couplet.writing.lexicon import has_negation, has_taboo, is_gloomy
from couplet.writing.prompt import HOUSE_COUPLETS
from couplet.writing.rules import check_couplet


def test_every_folk_couplet_passes_the_rules_and_the_voice(embedded_lm):
    folk = load_folk()
    assert len(folk) >= 140
    assert len({(c.upper, c.lower) for c in folk}) == len(folk)  # no duplicates
    assert not {c.upper for c in folk} & {h.upper for h in HOUSE_COUPLETS}  # the prompt shows those already
    for c in folk:
        _may_join_the_set(c, embedded_lm.vocab)
    themes = Counter(c.theme for c in folk)
    assert {"folk", "tech", "study", "health", "business"} <= set(themes), themes
    assert max(Counter(c.hengpi for c in folk).values()) <= 4  # 横批 vary
    assert len(folk_lines()) == 2 * len(folk)


def _may_join_the_set(c, vocab) -> None:
    checks = check_couplet(c.upper, c.lower, c.hengpi)
    assert checks["passed"], (c, checks["failures"])
    assert len(c.hengpi) == 4 and c.hengpi not in c.upper + c.lower
    text = c.upper + c.lower + c.hengpi
    assert not (has_taboo(text) or has_negation(text) or is_gloomy(text)), c
    assert all(ch in vocab for ch in text), c  # the model and the page's font know them


def test_the_second_round_passes_the_same_checks_and_repeats_no_line(embedded_lm):
    """assets/folk/round2.tsv: training data (the shipped model trained on it), kept apart from folk.tsv, which the
    page reads (exemplars, 横批, the lines it may not borrow)."""
    shipped = load_folk()
    second = load_folk(FOLK_ROUND2)
    assert len(second) >= 1000
    lines = [line for c in (*shipped, *second) for line in (c.upper, c.lower)]
    assert len(set(lines)) == len(lines)  # no line twice, within the round or against the set
    assert not {c.upper for c in second} & {h.upper for h in HOUSE_COUPLETS}
    for c in second:
        _may_join_the_set(c, embedded_lm.vocab)
    assert max(Counter(c.hengpi for c in (*shipped, *second)).values()) <= 4  # the cap holds once merged


def test_training_reads_both_rounds_and_the_cli_can_leave_them_out(embedded_lm, tmp_path):
    """The shipped model trained on both rounds; `--folk` names the files, none leaves the 春联 out."""
    pairs = [Pair(u, lo, "lvshi_mid") for u, lo in list(load_store().shelves[7].pairs)[:50]]
    house = {h.upper for h in HOUSE_COUPLETS}
    both = [c for c in (*load_folk(), *load_folk(FOLK_ROUND2)) if c.upper not in house]

    def folk_count(argv: list[str]) -> int:
        cfg = parse_context_args(["--data", "unused.tsv.xz", *argv])
        return ContextSampler(embedded_lm.tokenizer, pairs, load_store(), cfg, random.Random(0)).counts["folk"]

    assert folk_count([]) == len(both) > 2000
    assert folk_count(["--folk", str(FOLK)]) == len([c for c in load_folk() if c.upper not in house])
    assert folk_count(["--folk"]) == 0
    with pytest.raises(FileNotFoundError, match="no such file"):
        parse_context_args(["--data", "unused.tsv.xz", "--folk", str(tmp_path / "absent.tsv")])
    absent_unread = parse_context_args(["--data", "x", "--p-folk", "0", "--folk", str(tmp_path / "absent.tsv")])
    assert absent_unread.p_folk == 0  # a file that is never read need not exist
    assert ContextTrainConfig(data="", folk="").folk == () and ContextTrainConfig(data="", folk=str(FOLK)).folk == (
        str(FOLK),)  # the field's older form, one path as a string


def test_folk_couplets_are_exemplars():
    store = load_store()
    c = load_folk()[0]
    assert (c.upper, c.lower) in store.retrieve(c.upper, len(c.upper), k=6)


def test_an_entry_with_a_hengpi_continues_the_couplet(embedded_lm):
    tok, f = embedded_lm.tokenizer, FormatIds.of(embedded_lm.tokenizer)
    plain = entry_ids(tok, "春", "天增岁月人增寿", "春满乾坤福满门")
    topped = entry_ids(tok, "春", "天增岁月人增寿", "春满乾坤福满门", "福满人间")
    assert topped[: len(plain) - 1] == plain[:-1]  # the same couplet, then `<sep> 横批 <eos>`
    assert topped[len(plain) - 1 :] == [f.sep, *char_ids(tok, "福满人间"), f.eos]


def test_the_sampler_teaches_the_hengpi_after_folk_couplets(embedded_lm):
    tok, f = embedded_lm.tokenizer, FormatIds.of(embedded_lm.tokenizer)
    pairs = [Pair(u, lo, "lvshi_mid") for u, lo in list(load_store().shelves[7].pairs)[:300]]
    sampler = ContextSampler(tok, pairs, load_store(), ContextTrainConfig(data="", p_folk=1.0), random.Random(3))
    house = {h.upper for h in HOUSE_COUPLETS}
    topped = 0
    for _ in range(40):
        s = sampler.sample()
        last_sep = len(s.ids) - 1 - s.ids[::-1].index(f.sep)
        target = "".join(tok.convert_ids_to_tokens(s.ids[last_sep + 1 :]))
        if s.ids[-6] == f.sep:  # `… 下联 <sep> h h h h <eos>`: the 横批 carries loss, its <sep> does not
            topped += 1
            assert all(s.loss[-5:]) and not s.loss[-6]
        else:
            assert target.split("<mid>")[0] not in house
    assert topped >= 25  # p_hengpi = 0.9


def test_continuation_scores_equal_teacher_forcing(embedded_lm):
    """The shared-prefix batch (the couplet's KV repeated per candidate) scores what one full forward does."""
    lm = embedded_lm
    couplets = [("龙腾四海千家乐", "马跃九州万象新"), ("春回大地千山秀", "日暖神州万物荣")]
    candidates = ["万象更新", "龙马精神", "五谷丰登"]
    got = hengpi.continuation_logprobs(lm, couplets, candidates)
    for i, (u, lo) in enumerate(couplets):
        seqs = [[*hengpi._prefix(lm, u, lo), *char_ids(lm.tokenizer, h), lm.ids.eos] for h in candidates]
        logp = sequence_logprobs(lm.model, seqs, lm.ids.pad)[:, -5:].sum(-1)  # the 4 characters and <eos>
        assert torch.allclose(got[i], logp, atol=1e-3), (got[i], logp)


@pytest.mark.parametrize(("upper", "lower", "keywords"), [
    ("龙马奔腾春万里", "精神焕发福千家", "龙马精神"),
    ("万象更新春满院", "千祥云集福盈门", "万象更新"),
])
def test_the_hengpi_is_neither_the_keywords_nor_the_lines(embedded_lm, upper, lower, keywords):
    hengpi.clear_cache()
    chosen = hengpi.choose_hengpi(embedded_lm, upper, lower, keywords)
    assert chosen in hengpi.phrases() and len(chosen) == 4
    assert sorted(chosen) != sorted(keywords) and chosen not in upper and chosen not in lower


def test_the_keywords_reordered_are_no_hengpi_either():
    """燕舞莺歌 → 莺歌燕舞 over its couplet repeats the door's first four characters, only in another order."""
    upper, lower = "春满梅花千里绿", "风吹柳絮万家红"
    assert not hengpi.allowed("莺歌燕舞", upper, lower, keywords="燕舞莺歌")
    assert not hengpi.allowed("莺歌燕舞", upper, lower, keywords="莺歌燕舞")
    assert hengpi.allowed("莺歌燕舞", upper, lower, keywords="燕舞春风") and hengpi.allowed("莺歌燕舞", upper, lower)


def test_a_zodiac_hengpi_only_over_a_couplet_that_names_its_animal(embedded_lm):
    assert not hengpi.allowed("狗年吉祥", "春满梅花千里绿", "风吹柳絮万家红")
    assert hengpi.allowed("狗年吉祥", "金鸡辞旧岁", "玉犬贺新春")  # 犬 is 狗
    assert hengpi.allowed("吉羊开泰", "羊引春风开泰运", "鹊登梅枝报喜音")
    hengpi.clear_cache()
    upper, lower = "春满梅花千里绿", "风吹柳絮万家红"
    assert not set(hengpi.shortlist(embedded_lm, upper, lower)) & {
        h for h in hengpi.phrases() if set(h) & hengpi.ANIMALS}


def test_the_shipped_prior_is_the_embedded_model_own(embedded_lm):
    """assets/model/hengpi_prior.json is keyed to the embedded weights (float32 on CPU, these candidates), so every
    new process uses it instead of scoring ~600 phrases; its values are what the model computes (a sample of
    phrases: each phrase's prior is its own). After retraining: `python -m couplet.writing.hengpi --save-prior`."""
    import json

    from couplet.models.loading import EMBEDDED_MODEL

    saved = json.loads((EMBEDDED_MODEL / hengpi.PRIOR_FILE).read_text(encoding="utf-8"))
    if embedded_lm.device != "cpu":
        pytest.skip("the shipped prior is the CPU float32 one; on a GPU it is computed")
    assert saved["key"] == hengpi.prior_key(embedded_lm), "stale: run python -m couplet.writing.hengpi --save-prior"
    assert list(saved["prior"]) == list(hengpi.phrases())
    sample = list(hengpi.phrases())[::40]
    computed = hengpi.compute_prior(embedded_lm, sample)
    assert [saved["prior"][h] for h in sample] == pytest.approx([computed[h] for h in sample], abs=1e-4)


def test_a_prior_whose_key_does_not_match_is_computed_instead(tiny_checkpoint, tmp_path):
    import json
    import shutil

    from couplet.models.loading import load_model

    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, folder)
    bogus = {h: 0.0 for h in hengpi.phrases()}
    (folder / hengpi.PRIOR_FILE).write_text(json.dumps({"key": "stale", "prior": bogus}), encoding="utf-8")
    lm = load_model(str(folder), device="cpu", dtype="float32")
    assert hengpi._prior(lm) == pytest.approx(hengpi.compute_prior(lm)) and hengpi._prior(lm) != bogus
    hengpi.save_prior(lm)  # now keyed to these weights: a new process reads it back
    again = load_model(str(folder), device="cpu", dtype="float32")
    assert hengpi._prior(again) == json.loads((folder / hengpi.PRIOR_FILE).read_text(encoding="utf-8"))["prior"]


def test_the_draft_checker_keeps_what_may_join_the_set_and_says_why_the_rest_may_not(tmp_path):
    """scripts/folk_check.py, as the set's writers ran it: every rule of the first test, per draft row."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    drafts = tmp_path / "drafts.tsv"
    drafts.write_text("\n".join([
        "晶片精微开大业\t星河浩瀚展宏图\t科技兴邦\ttech",  # passes
        "天增岁月人增寿\t春满乾坤福满门\t福满人间\tfolk",  # the house prefix shows it
        "春风岂肯迎新岁\t瑞气盈门贺吉年\t吉庆有余\tfolk",  # 岂: a negation
        "花开富贵千门喜\t竹报平安万户春\t花开富贵\tfolk",  # its 横批 is words of a line
        "晶片精微开大业\t春光灿烂满家园\t锦绣前程\ttech",  # a line already drafted above
        "梅开五福迎好运\t柳舞三春报佳音\t梅柳争春\tspring",  # shares 五福迎好 with the avoided file
        "龙马奔腾春万里\t精神焕发福千家\t骏业宏开\tqianzi",  # opens on 龙马 / 精神, a listed phrase
        "春风送暖千家乐\t紫气东来百业兴\t万象更新\tfolk",  # its 上联 is already in the set
    ]) + "\n", encoding="utf-8")
    the_set = tmp_path / "set.tsv"  # the set the drafts join (the shipped one by default)
    the_set.write_text("upper\tlower\thengpi\ttheme\n春风送暖千家乐\t瑞雪迎新万户欢\t辞旧迎新\tfolk\n",
                       encoding="utf-8")
    listed = tmp_path / "phrases.txt"
    listed.write_text("五谷丰登\n龙马精神\n", encoding="utf-8")
    avoid = tmp_path / "measured.tsv"
    avoid.write_text("瑞雪纷飞五福迎好运\t红梅傲立千门报新春\n", encoding="utf-8")
    kept = tmp_path / "kept.tsv"
    done = subprocess.run([sys.executable, "scripts/folk_check.py", str(drafts), "--keep", str(kept),
                           "--set", str(the_set), "--avoid", str(avoid), "--avoid-phrases", str(listed)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "8 drafts, 1 pass, 7 dropped" in done.stdout
    for why in ("house prefix", "negation", "words of a line", "duplicate", "avoided:", "avoided phrase"):
        assert why in done.stdout, (why, done.stdout)
    assert "duplicate: 1" not in done.stdout and "duplicate: 2" in done.stdout  # one of the drafts, one of the set
    assert "瑞雪纷飞" not in done.stdout  # the avoided file's lines are never printed
    assert kept.read_text(encoding="utf-8").splitlines() == ["upper\tlower\thengpi\ttheme",
                                                            "晶片精微开大业\t星河浩瀚展宏图\t科技兴邦\ttech"]
    missing = subprocess.run([sys.executable, "scripts/folk_check.py", str(tmp_path / "absent.tsv")],
                             cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0 and "no such file" in missing.stderr
