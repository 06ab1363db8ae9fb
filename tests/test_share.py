"""The share link's query string (`couplet.page.share`): what it holds, what a wrong value becomes."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest

from couplet.page.share import DEFAULT_MODES, DEFAULT_TEMPERATURE, MAX_VALUE_CHARS, ShareLink, parse_query, share_url
from couplet.writing.calendar import DEFAULT_YEAR


def roundtrip(link: ShareLink) -> ShareLink:
    return parse_query(dict(parse_qsl(urlsplit(share_url("http://h/app/?old=1#x", link)).query)))


def test_a_link_round_trips_every_field():
    link = ShareLink("keywords", keywords="龙马精神", length=5, acrostic=True, temperature=0.8, seed=3, year=2031,
                     modes=["full", "int8"], best=True)
    back = roundtrip(link)
    assert (back.task, back.keywords, back.length, back.acrostic, back.temperature, back.seed, back.year,
            back.modes, back.best) == ("keywords", "龙马精神", 5, True, 0.8, 3, 2031, ["full", "int8"], True)
    assert back.notes == [] and back.error == ""
    duixia = roundtrip(ShareLink("duixia", upper="春风送暖千家福", seed=7))
    assert (duixia.task, duixia.upper, duixia.seed, duixia.best) == ("duixia", "春风送暖千家福", 7, False)
    assert "best" not in ShareLink("duixia", upper="春风送暖千家福").query()  # links made before 择优 read the same


def test_the_url_keeps_han_characters_readable_and_drops_the_old_query():
    url = share_url("http://h/app/?kw=旧&seed=1#top", ShareLink("keywords", keywords="龙马 精神&x=1"))
    assert url.startswith("http://h/app/?kw=龙马%20精神%26x%3D1&len=7&")
    assert dict(parse_qsl(urlsplit(url).query))["kw"] == "龙马 精神&x=1"  # nothing leaks into other keys


def test_no_couplet_in_the_link_writes_nothing():
    link = parse_query({})
    assert link.task == "" and link.notes == [] and link.modes == list(DEFAULT_MODES)


@pytest.mark.parametrize(("params", "field", "value", "note"), [
    ({"kw": "春", "len": "6"}, "length", 7, "字数「6」无效"),
    ({"kw": "春", "cang": "yes"}, "acrostic", False, "藏头「yes」无效"),
    ({"kw": "春", "t": "nan"}, "temperature", DEFAULT_TEMPERATURE, "温度「nan」不是数字"),
    ({"kw": "春", "t": "9"}, "temperature", DEFAULT_TEMPERATURE, "温度 9 超出 0–1.5"),
    ({"kw": "春", "seed": "abc"}, "seed", 0, "随机种子「abc」不是数字"),
    ({"kw": "春", "seed": "-1"}, "seed", 0, "随机种子 -1 超出"),
    ({"kw": "春", "seed": "2147483648"}, "seed", 0, "随机种子 2147483648 超出 0–2147483647"),  # not 2.14748e+09
    ({"kw": "春", "seed": "12.5"}, "seed", 0, "随机种子「12.5」不是整数"),
    ({"kw": "春", "year": "1066"}, "year", DEFAULT_YEAR, "年份 1066 超出 1900–2100"),
    ({"kw": "春", "best": "yes"}, "best", False, "择优「yes」无效"),
    ({"kw": "春", "modes": "full,turbo"}, "modes", list(DEFAULT_MODES), "未知的缓存模式"),
])
def test_a_wrong_value_takes_the_default_and_says_so(params, field, value, note):
    link = parse_query(params)
    assert getattr(link, field) == value
    assert len(link.notes) == 1 and note in link.notes[0]
    assert link.task == "keywords" and link.error == ""  # the couplet is still written


@pytest.mark.parametrize(("params", "error"), [
    ({"kw": "<script>alert(1)</script>"}, "关键词里没有汉字"),
    ({"kw": "一二三四五六七八九"}, "关键词最多 8 个汉字"),
    ({"up": "春风"}, "上联须为 5 字或 7 字"),
])
def test_text_the_form_would_refuse_is_refused_the_same_way(params, error):
    link = parse_query(params)
    assert error in link.error
    assert link.keywords == params.get("kw", "") and link.upper == params.get("up", "")  # shown, as text


def test_an_overlong_value_is_cut_and_said_so():
    link = parse_query({"kw": "春" * 500})
    assert len(link.keywords) == MAX_VALUE_CHARS
    assert any("过长" in n for n in link.notes)
