"""The one registry of modes by name: the CLI choices, the UI toggles, the benchmark and the tests read it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from couplet.kvcache.base import Policy
from couplet.kvcache.combo import ComboPolicy
from couplet.kvcache.full import FullPolicy
from couplet.kvcache.quantized import Int4Policy, Int8Policy
from couplet.kvcache.selective import SelectivePolicy
from couplet.kvcache.shared import SharedPolicy
from couplet.kvcache.window import WindowPolicy

MODES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (FullPolicy, WindowPolicy, SelectivePolicy, Int8Policy, Int4Policy, SharedPolicy, ComboPolicy)
}


@dataclass(frozen=True)
class ModeInfo:
    """What the UI shows for a mode."""

    label_zh: str
    summary_zh: str


MODE_INFO: dict[str, ModeInfo] = {
    "full": ModeInfo("完整缓存", "保留全部键值，精度不变，作为其他模式的对照基准。"),
    "window": ModeInfo("滑动窗口",
                       "只留最近的字，其余丢弃（也可留开头几个“注意力汇点”；对联只有二十来字，实测不留更好）。"),
    "selective": ModeInfo("选择性保留", "按模型实际投入的注意力挑选要留的字，并护住关键词和上联对位字。"),
    "int8": ModeInfo("INT8 量化", "键按通道或按字、值按字分组存成 8 位整数，连同缩放系数计入字节。"),
    "int4": ModeInfo("INT4 量化", "同上但每个数只占 4 位，两个数装进一个字节，内存再减一半。"),
    "shared": ModeInfo("共享前缀缓存", "相同的提示词前缀只算一次、只存一份，所有请求共用。"),
    "combo": ModeInfo("组合策略", "提示词共享并量化，生成部分选择性保留并量化存储。"),
}


def option_names(name: str) -> list[str]:
    """The knobs (dataclass fields) of mode `name`."""
    return [f.name for f in fields(MODES[name])]  # type: ignore[arg-type]


def make_mode(name: str, **options: Any) -> Policy:
    """The policy for mode `name` with `options` as its knobs, e.g. `make_mode("selective", ratio=0.5)`.

    Raises ValueError for an unknown mode or option (listing the valid ones) and for invalid values.
    """
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}; valid modes: {', '.join(MODES)}")
    valid = option_names(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none"
        raise ValueError(f"mode {name!r} has no option {', '.join(map(repr, unknown))}; its options: {listed}")
    return MODES[name](**options)
