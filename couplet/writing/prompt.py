"""The prompt an LLM couplet service sends: a house prefix, exemplars for the keywords, then the request.

    <bos> [house: 14 classic 春联, each with its 横批 as keywords]   ← the same for every visitor
          [exemplars: k pairs retrieved for (keywords, length)]      ← the same for the same keywords
          <Ln> keywords <sep>                                         ← the request; the model writes on

About 400 tokens for a 7-character request, 300 of them the house prefix: that is what the prefix pool
shares across every visitor, and what retention modes compress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from couplet.models.tokenizer import entry_ids
from couplet.writing.exemplars import DEFAULT_K, load_store


@dataclass(frozen=True)
class HouseCouplet:
    upper: str
    lower: str
    hengpi: str


# 门面：十四副传统民间春联（公有领域），每位访客的提示都以它们开头。
HOUSE_COUPLETS: tuple[HouseCouplet, ...] = (
    HouseCouplet("天增岁月人增寿", "春满乾坤福满门", "万象更新"),
    HouseCouplet("一帆风顺年年好", "万事如意步步高", "吉星高照"),
    HouseCouplet("爆竹声中辞旧岁", "梅花香里报新春", "辞旧迎新"),
    HouseCouplet("春回大地千山秀", "日照神州万木荣", "春回大地"),
    HouseCouplet("五湖四海皆春色", "万水千山尽得辉", "万紫千红"),
    HouseCouplet("人寿年丰家家乐", "国泰民安处处春", "国泰民安"),
    HouseCouplet("春临大地百花艳", "节至人间万象新", "欢度春节"),
    HouseCouplet("春雨丝丝润万物", "红梅点点绣千山", "春意盎然"),
    HouseCouplet("丹凤呈祥龙献瑞", "红桃贺岁杏迎春", "福满人间"),
    HouseCouplet("岁通盛世家家富", "人遇年华个个欢", "喜气盈门"),
    HouseCouplet("年年顺景财源广", "岁岁平安福寿多", "四季平安"),
    HouseCouplet("旧岁又添几个喜", "新年更上一层楼", "喜迎新春"),
    HouseCouplet("门迎百福至", "户纳千祥来", "五福临门"),
    HouseCouplet("春风迎新岁", "瑞雪兆丰年", "迎春接福"),
)


def house_ids(tok: PreTrainedTokenizerBase, house: Sequence[HouseCouplet] = HOUSE_COUPLETS) -> list[int]:
    """The house prefix's tokens (without `<bos>`)."""
    return [t for h in house for t in entry_ids(tok, h.hengpi, h.upper, h.lower)]


def exemplar_ids(tok: PreTrainedTokenizerBase, exemplars: Sequence[tuple[str, str]]) -> list[int]:
    return [t for u, lo in exemplars for t in entry_ids(tok, "", u, lo)]


@dataclass(frozen=True)
class PromptConfig:
    """What goes before the request. `k=0` and `house=False` give the bare one-couplet prompt."""

    house: bool = True
    k: int = DEFAULT_K
    couplets: tuple[HouseCouplet, ...] = HOUSE_COUPLETS  # the house prefix (another one for experiments)

    def __post_init__(self) -> None:
        if not 0 <= self.k <= 12:
            raise ValueError(f"k (exemplars) must be in 0..12, got {self.k}")


@dataclass(frozen=True)
class Context:
    """The context of one request: its exemplars, and the tokens before `<Ln> keywords <sep>`."""

    exemplars: tuple[tuple[str, str], ...]
    ids: tuple[int, ...]
    house: tuple[HouseCouplet, ...] = ()

    @property
    def borrowed(self) -> list[str]:
        """Every line the couplet must not copy from (house and exemplars)."""
        return [line for pair in self.exemplars for line in pair] + \
            [line for h in self.house for line in (h.upper, h.lower)]


DEFAULT_PROMPT = PromptConfig()
BARE_PROMPT = PromptConfig(house=False, k=0)


def build_context(tok: PreTrainedTokenizerBase, query: str, length: int, cfg: PromptConfig = DEFAULT_PROMPT) -> Context:
    """House prefix, then the exemplars retrieved for `query` (keywords, or the 上联 for 对下联)."""
    exemplars = tuple(load_store().retrieve(query, length, cfg.k)) if cfg.k else ()
    house = cfg.couplets if cfg.house else ()
    return Context(exemplars, tuple(house_ids(tok, house) + exemplar_ids(tok, exemplars)), house)
