"""The one registry of modes by name, and the single source of what is known about each: the CLI choices,
the page's toggles and colours, the benchmark, the evaluation sweeps and the tests all read `MODE_INFO`.

A new mode is one file (its policy dataclass) plus one entry here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from couplet.kvcache.combo import ComboPolicy
from couplet.kvcache.full import FullPolicy
from couplet.kvcache.policy import Policy
from couplet.kvcache.quantized import Int4Policy, Int8Policy
from couplet.kvcache.selective import SelectivePolicy
from couplet.kvcache.shared import SharedPolicy
from couplet.kvcache.snapkv import SnapKVPolicy
from couplet.kvcache.window import WindowPolicy


@dataclass(frozen=True)
class ModeInfo:
    """Everything about a mode apart from its code."""

    policy: type[Policy]
    label_zh: str  # the page's name for it
    summary_zh: str  # one line for the toggle
    color: str  # chart lines and table swatches, the same everywhere
    lossless: bool  # greedy output identical to `full` at its defaults, by construction
    byte_target: float  # most of `full`'s bytes one request may hold at the defaults (tests check it)
    knob: str | None = None  # the budget knob `evaluate --sweep` varies
    sweep: tuple[Any, ...] = ()  # and its values


RATIOS = (0.3, 0.4, 0.5, 0.6, 0.75, 1.0)

MODE_INFO: dict[str, ModeInfo] = {
    "full": ModeInfo(FullPolicy, "完整缓存", "保留全部键值，精度不变，作为其他模式的对照基准。",
                     "#3b2a20", lossless=True, byte_target=1.0),  # ink: the baseline
    "window": ModeInfo(WindowPolicy, "滑动窗口", "只留最近的字，其余丢弃（也可留开头几个“注意力汇点”）。",
                       "#e0792b", lossless=False, byte_target=0.53, knob="ratio", sweep=RATIOS),  # lantern
    "selective": ModeInfo(SelectivePolicy, "选择性保留",
                          "先试写几个字，看写联时注意力落在何处，据此挑选要留的字，护住关键词和上联对位字；删去的字并入每个注意力头的一个合并槽。",
                          "#2e8b57", lossless=False, byte_target=0.53, knob="ratio", sweep=RATIOS),  # jade
    "snapkv": ModeInfo(SnapKVPolicy, "SnapKV 提示压缩",
                       "读完提示后，按末尾几字对各字的注意力（邻域池化）一次性删减提示。",
                       "#7b3f98", lossless=False, byte_target=0.53, knob="ratio", sweep=RATIOS),  # plum
    "int8": ModeInfo(Int8Policy, "INT8 量化", "键按通道或按字、值按字分组存成 8 位整数，连同缩放系数计入字节。",
                     "#d4a017", lossless=False, byte_target=0.55, knob="residual", sweep=(0, 1, 2, 4)),  # gold
    "int4": ModeInfo(Int4Policy, "INT4 量化", "同上但每个数只占 4 位，两个数装进一个字节，内存再减一半。",
                     "#8a5a00", lossless=False, byte_target=0.32, knob="residual", sweep=(0, 1, 2, 4)),  # bronze
    "shared": ModeInfo(SharedPolicy, "共享前缀缓存", "相同的提示词前缀只算一次、只存一份，所有请求共用。",
                       "#1f5f8b", lossless=True, byte_target=1.0),  # palace blue
    # combo (int8 + the pool): one request alone holds ~int8's share (0.53x, bf16); visitors who share the
    # house prefix split its blocks' bytes (docs/results/serving.md)
    "combo": ModeInfo(ComboPolicy, "组合策略", "提示词经共享前缀池只算一次、只存一份，全部键值以 8 位整数存储。",
                      "#b22222", lossless=False, byte_target=0.55, knob="ratio", sweep=RATIOS),  # vermilion
}

MODES: dict[str, type[Policy]] = {name: info.policy for name, info in MODE_INFO.items()}


def parse_modes(modes: str | Iterable[str], allow_all: bool = True) -> list[str]:
    """`"full,int4"`, `["full", "int4"]` or (with `allow_all`) `"all"` -> the mode names, in the order given.

    Raises ValueError naming the first unknown mode and listing the valid ones."""
    names = [m.strip() for m in (modes.split(",") if isinstance(modes, str) else modes) if m.strip()]
    if allow_all and names == ["all"]:
        return list(MODES)
    for name in names:
        if name not in MODES:
            extra = " (or all)" if allow_all else ""
            raise ValueError(f"unknown mode {name!r}; valid modes: {', '.join(MODES)}{extra}")
    return names


def option_names(name: str) -> list[str]:
    """The knobs (dataclass fields) of mode `name`."""
    return [f.name for f in fields(MODES[name])]  # type: ignore[arg-type]


def make_mode(name: str, **options: Any) -> Policy:
    """The policy for mode `name` with `options` as its knobs, e.g. `make_mode("selective", ratio=0.5)`.

    Raises ValueError for an unknown mode or option (listing the valid ones) and for invalid values.
    """
    parse_modes([name], allow_all=False)
    valid = option_names(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none"
        raise ValueError(f"mode {name!r} has no option {', '.join(map(repr, unknown))}; its options: {listed}")
    return MODES[name](**options)
