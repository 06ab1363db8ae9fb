"""Keyword normalisation, tones, placement and the couplet checks: pure functions, no model."""

import pytest

from couplet.writing.placement import place_keywords
from couplet.writing.rules import check_couplet, parallelism, rhythm_positions
from couplet.writing.text import CoupletInputError, normalize_keywords
from couplet.writing.tones import LEVEL, OBLIQUE, tone_class


def test_traditional_and_full_width_are_normalised_with_notes():
    kw = normalize_keywords("龍馬精神！ＡＢ")
    assert kw.text == "龙马精神"
    assert any("繁体" in n for n in kw.notes)
    assert any("非汉字" in n and "AB" in n for n in kw.notes)


@pytest.mark.parametrize("raw", ["", "   ", "hello 123", "!!!", "<img src=x onerror=alert(1)>"])
def test_input_without_han_is_refused_clearly(raw):
    with pytest.raises(CoupletInputError, match="汉字"):
        normalize_keywords(raw)


def test_too_many_characters_refused():
    with pytest.raises(CoupletInputError, match="最多 8"):
        normalize_keywords("一二三四五六七八九")


def test_unknown_characters_are_reported_not_dropped():
    kw = normalize_keywords("龙犇", vocab={"龙": 1})
    assert kw.text == "龙犇" and kw.unknown == ["犇"]
    assert any("犇" in n for n in kw.notes)


def test_invisible_characters_dropped_are_named_by_code_point():
    kw = normalize_keywords("春\u200b风\x00")  # a zero-width space and a NUL: dropped, and the note shows them
    assert kw.text == "春风" and "已忽略非汉字字符：〔U+200B〕〔U+0000〕" in kw.notes


def test_tone_classes_from_pypinyin():
    assert tone_class("春") == LEVEL and tone_class("门") == LEVEL
    assert tone_class("福") == LEVEL  # modern reading fú (新声韵), not the classical entering tone
    assert tone_class("意") == OBLIQUE and tone_class("好") == OBLIQUE
    assert tone_class("a") is None


def test_placement_heads_and_acrostic():
    p = place_keywords("龙马精神", 7)
    assert p.upper == {0: "龙", 1: "马"} and p.lower == {0: "精", 1: "神"}
    p = place_keywords("龙马精神", 7, "acrostic")
    assert p.upper == {0: "龙", 1: "精"} and p.lower == {0: "马", 1: "神"}
    p = place_keywords("福", 5)
    assert p.upper == {0: "福"} and p.lower == {}
    with pytest.raises(ValueError, match="placement"):
        place_keywords("福", 5, "middle")


@pytest.mark.parametrize(("keywords", "style", "lower"), [
    ("大吉大利", "heads", {1: "大", 2: "利"}),  # 大 at the head of both lines would be 同位重字
    ("年年有余", "acrostic", {1: "年", 2: "余"}),
    ("大大大大", "heads", {2: "大", 3: "大"}),
])
def test_placement_never_puts_a_repeated_keyword_at_the_same_position(keywords, style, lower):
    p = place_keywords(keywords, 7, style)
    assert p.lower == lower
    assert not any(p.upper.get(i) == c for i, c in p.lower.items())


def test_check_passes_a_classic_couplet():
    c = check_couplet("天增岁月人增寿", "春满乾坤福满门", "四海同春", "春")
    assert c["length"]["ok"] and c["tones"]["ok"] and c["keywords"]["ok"]
    # 增/满 repeat inside each line but never at the same position in both lines
    assert c["same_position"]["ok"] and c["passed"]


def test_check_explains_failures_in_chinese():
    c = check_couplet("春风送暖入屠苏", "春风送暖入屠苏", "", "龙")
    assert not c["passed"]
    messages = " ".join(c["failures"])
    assert "同位重字" in messages and "缺少关键词" in messages and "平仄不合" in messages
    c = check_couplet("春风", "明月好", "", "")
    assert not c["length"]["ok"] and "字数不合" in c["length"]["message"]


def test_parallelism_rewards_contrast_and_classes():
    good = parallelism("青山不墨千秋画", "绿水无弦万古琴")
    bad = parallelism("青山不墨千秋画", "青山不墨千秋画")
    assert good["score"] > 0.7 > bad["score"]
    assert any("青" in p and "绿" in p for p in good["pairs"])
    assert rhythm_positions(7) == [1, 3, 5, 6] and rhythm_positions(5) == [1, 3, 4]


def test_parallelism_sets_the_keywords_own_pairs_apart():
    # 人工 / 智能 at the heads: 工 and 能 are both 平 at the 2nd character, a 失对 no writer chose
    c = check_couplet("人工妙句新春力", "智能奇字大时科", "巧夺天工", "人工智能")["parallelism"]
    assert c["given_clash"] == [1]
    assert c["written"] > c["score"]  # the pairs the model wrote (positions 3–7) contrast better
    assert "第 2 字「工」对「能」平仄不能相对" in c["message"] and "关键词所定" in c["message"]
    # the same lines without keywords: every pair is the writer's, so nothing is set apart
    free = check_couplet("人工妙句新春力", "智能奇字大时科")["parallelism"]
    assert free["given_clash"] == [] and free["written"] == free["score"] == c["score"]
    assert "关键词" not in free["message"]
    # 龙马 / 精神: 马 仄 against 神 平, the keywords' own pair contrasts, so there is nothing to explain
    ok = check_couplet("龙马新随云气动", "精神时见雨光浮", "", "龙马精神")["parallelism"]
    assert ok["given_clash"] == [] and "关键词" not in ok["message"]
    assert ok["written"] != ok["score"]  # still scored apart: the written pairs' 对仗 alone
    # 对下联: the 上联 is given whole, but the 下联 is the writer's, so no pair is set apart
    duixia = check_couplet("人工妙句新春力", "智能奇字大时科", keywords="人工智能", given_upper=True)
    assert duixia["parallelism"]["given_clash"] == []
