"""Checking a couplet: the hard rules, and a parallelism (对仗) score, explained in Chinese.

Hard rules (all must hold for `passed`): 上联 and 下联 of equal length, 5 or 7; only Han characters;
上联 ends on an oblique tone (仄) and 下联 on a level tone (平); every keyword character appears in the
上联, 下联 or 横批; no character at the same position in both lines (lazy parallelism).

Parallelism score in [0, 1], our design:
- 平仄相对 (0.6): at the rhythm positions — the 2nd, 4th, 6th characters (二四六分明; 2nd and 4th for
  five-character lines) and the last — the two lines should have opposite tones;
- 词类相对 (0.4): characters at the same position that both belong to one of a few semantic classes
  (numbers, colours, directions, seasons, heavens, landscape, plants, animals) should belong to the
  same class (红 opposite 绿, 山 opposite 水). Positions where neither character is classed do not count.
"""

from __future__ import annotations

from typing import Any

from couplet.writing.text import is_han
from couplet.writing.tones import LEVEL, OBLIQUE, tone_class

SEMANTIC_CLASSES: dict[str, str] = {
    "数字": "一二三四五六七八九十百千万两双半几孤独单",
    "颜色": "红赤朱丹青绿碧翠蓝紫白素黄金银黑乌玄彩",
    "方位": "东西南北上下左右前后中内外里边",
    "时令": "春夏秋冬年岁月日朝夕晨昏晓夜时今古昔旦",
    "天象": "天风云雨雪霜露雷电星虹霞烟雾阳光",
    "山水": "山水江河湖海溪泉川峰岭岩石波涛浪潮洲岸",
    "草木": "花草木树林竹松柏梅兰菊柳桃李荷莲叶枝根桑杨",
    "鸟兽": "龙虎马牛羊鸡犬猪鼠兔蛇猴鸟燕莺雁鹤凤鹰鱼蝶蜂",
}
CLASS_OF = {ch: name for name, chars in SEMANTIC_CLASSES.items() for ch in chars}


def rhythm_positions(length: int) -> list[int]:
    """0-based positions where tones must contrast: 2nd, 4th, (6th,) and the last character."""
    return [*range(1, length - 1, 2), length - 1]


def _tone_contrasts(upper: str, lower: str, positions: list[int]) -> list[bool]:
    """Per position: do the two lines' characters have opposite tones (both known)?"""
    return [tone_class(upper[i]) is not None and tone_class(lower[i]) is not None
            and tone_class(upper[i]) != tone_class(lower[i]) for i in positions]


def _score(upper: str, lower: str, skip: frozenset[int] = frozenset()) -> tuple[float, float, float | None, list[str]]:
    """(score, tone contrast, class match or None, notes) over the positions not in `skip`."""
    n = min(len(upper), len(lower))
    contrasts = _tone_contrasts(upper, lower, [i for i in rhythm_positions(n) if i < n and i not in skip])
    tone_score = sum(contrasts) / len(contrasts) if contrasts else 0.0
    matched, compared, notes = 0, 0, []
    for i, (a, b) in enumerate(zip(upper, lower, strict=False)):
        ca, cb = CLASS_OF.get(a), CLASS_OF.get(b)
        if i not in skip and (ca or cb):
            compared += 1
            if ca == cb:
                matched += 1
                notes.append(f"「{a}」对「{b}」（{ca}）")
    class_score = matched / compared if compared else None
    score = tone_score if class_score is None else 0.6 * tone_score + 0.4 * class_score
    return score, tone_score, class_score, notes


def parallelism(upper: str, lower: str, given: frozenset[int] = frozenset()) -> dict[str, Any]:
    """The 对仗 score and the evidence behind it.

    `given`: 0-based positions where both lines hold a character the visitor gave (the keywords' halves at the
    heads: 人工 / 智能). No writer chooses those pairs, so beside the score over every position, `written` is
    the score over the others, and `given_clash` lists the given rhythm positions whose tones cannot contrast
    (工 and 能 both 平 at the 2nd character): the keywords' own 失对, which decoding cannot mend.
    """
    score, tone_score, class_score, notes = _score(upper, lower)
    out: dict[str, Any] = {"score": round(score, 4), "tone_contrast": round(tone_score, 4),
                           "class_match": None if class_score is None else round(class_score, 4), "pairs": notes}
    n = min(len(upper), len(lower))
    given = frozenset(i for i in given if i < n)
    written = _score(upper, lower, given)[0] if given else score
    clash = [i for i in rhythm_positions(n)[:-1] if i in given and not _tone_contrasts(upper, lower, [i])[0]]
    return {**out, "written": round(written, 4), "given_clash": clash}


def keyword_positions(upper: str, lower: str, keywords: str) -> frozenset[int]:
    """Positions where both lines hold a keyword character. The decoding fixes each keyword character at its
    place and never writes it a second time, so these are exactly the pairs the placement set."""
    chars = set(keywords)
    return frozenset(i for i, (a, b) in enumerate(zip(upper, lower, strict=False)) if a in chars and b in chars)


def check_couplet(upper: str, lower: str, hengpi: str = "", keywords: str = "",
                  given_upper: bool = False) -> dict[str, Any]:
    """All checks, each with `ok` and a Chinese `message`; `passed` is the conjunction of hard rules.

    `given_upper` (对下联): the 上联 is the visitor's; its end tone is theirs, so the tone rule asks only that
    the 下联 end on the contrasting tone (平 after 仄, the convention; 仄 after a 平 ending, said so).
    """
    checks: dict[str, Any] = {}
    length_ok = len(upper) == len(lower) and len(upper) in (5, 7)
    checks["length"] = {"ok": length_ok, "message": f"上下联各 {len(upper)} 字" if length_ok else
                        f"字数不合：上联 {len(upper)} 字，下联 {len(lower)} 字（应同为 5 或 7 字）"}
    non_han = [c for c in upper + lower + hengpi if not is_han(c)]
    checks["han_only"] = {"ok": not non_han, "message": "全为汉字" if not non_han else
                          f"含非汉字字符：{''.join(non_han)}"}
    up_tone = tone_class(upper[-1]) if upper else None
    low_tone = tone_class(lower[-1]) if lower else None
    tones_ok = up_tone == OBLIQUE and low_tone == LEVEL
    message = "上联仄声收尾，下联平声收尾"
    if given_upper and up_tone == LEVEL and low_tone == OBLIQUE:
        tones_ok, message = True, "上联平声收尾（不合上仄下平之惯例），下联以仄声相对"
    elif given_upper and up_tone is None and low_tone == LEVEL:
        tones_ok, message = True, "上联末字为轻声，下联平声收尾"
    checks["tones"] = {"ok": tones_ok, "upper_last": up_tone, "lower_last": low_tone,
                       "message": message if tones_ok else
                       f"平仄不合：上联末字「{upper[-1:]}」为{up_tone or '轻声'}，下联末字「{lower[-1:]}」为"
                       f"{low_tone or '轻声'}（应上仄下平）"}
    text = upper + lower + hengpi
    missing = [c for c in dict.fromkeys(keywords) if c not in text]
    checks["keywords"] = {"ok": not missing, "missing": missing, "applies": bool(keywords),  # 对下联: none
                          "message": f"关键词「{keywords}」均已嵌入" if not missing else
                          f"缺少关键词：{''.join(missing)}"}
    same = [i + 1 for i, (a, b) in enumerate(zip(upper, lower, strict=False)) if a == b]
    checks["same_position"] = {"ok": not same, "positions": same,
                               "message": "上下联同位无重字" if not same else
                               "同位重字：第 " + "、".join(map(str, same)) + " 字上下联相同，对仗偷懒"}
    par = parallelism(upper, lower, keyword_positions(upper, lower, "" if given_upper else keywords))
    clash = "、".join(f"第 {i + 1} 字「{upper[i]}」对「{lower[i]}」平仄不能相对" for i in par["given_clash"])
    checks["parallelism"] = {**par, "message": f"对仗得分 {par['score']:.2f}（平仄相对 {par['tone_contrast']:.2f}"
                             + (f"，词类相对 {par['class_match']:.2f}" if par["class_match"] is not None else "")
                             + "）" + (f"；{clash}，为关键词所定（嵌字所限），其余各字得分 {par['written']:.2f}"
                                      if clash else "")}
    hard = ("length", "han_only", "tones", "keywords", "same_position")
    checks["given_upper"] = given_upper
    checks["passed"] = all(checks[k]["ok"] for k in hard)
    checks["failures"] = [checks[k]["message"] for k in hard if not checks[k]["ok"]]
    return checks
