"""The registry: names, knobs, validation messages, UI metadata."""

from __future__ import annotations

import dataclasses

import pytest

from couplet.kvcache import MODE_INFO, MODES, Retention, make_mode, option_names, parse_modes


def test_the_registry_is_the_single_source() -> None:
    assert set(MODE_INFO) == set(MODES) and list(MODES)[0] == "full"
    assert MODE_INFO["window"].label_zh == "滑动窗口" and MODE_INFO["int4"].label_zh == "INT4 量化"
    colors = [info.color for info in MODE_INFO.values()]
    assert len(set(colors)) == len(colors) and all(c.startswith("#") and len(c) == 7 for c in colors)
    for name, info in MODE_INFO.items():
        policy = make_mode(name)
        assert dataclasses.is_dataclass(policy) and type(policy) is info.policy is MODES[name]
        assert policy.describe().startswith(f"{name}: ")
        assert info.label_zh and info.summary_zh and 0 < info.byte_target <= 1.0
        assert info.lossless == (info.byte_target == 1.0)  # a lossless mode here saves no bytes on its own
        if info.knob is not None:  # every sweep value is a valid knob setting
            assert info.knob in option_names(name) and info.sweep
            for value in info.sweep:
                make_mode(name, **{info.knob: value})
        parts = policy.compose()
        assert (parts.retention is not None) == isinstance(policy, Retention) or name == "combo"
    described = make_mode("selective", ratio=0.25).describe()
    assert described == ("selective: ratio=0.25, sinks=0, recent=8, floor=4, decay=0.5, keep_prompt=False, "
                         "merge=True, lookahead=8, chunk=32")


def test_unknown_mode_lists_valid_names() -> None:
    valid = ", ".join(MODES)
    with pytest.raises(ValueError, match=f"unknown mode 'h2o'; valid modes: {valid}$"):
        make_mode("h2o")
    with pytest.raises(ValueError, match=f"unknown mode 'h2o'; valid modes: {valid} \\(or all\\)"):
        parse_modes("full, h2o")
    assert parse_modes(" int4,full ") == ["int4", "full"] and parse_modes("all") == list(MODES)
    assert parse_modes(["combo"]) == ["combo"]
    with pytest.raises(ValueError, match="unknown mode 'all'"):
        parse_modes("all", allow_all=False)


def test_unknown_option_lists_the_mode_options() -> None:
    with pytest.raises(ValueError, match="mode 'window' has no option 'recent'; its options: ratio, sinks, floor"):
        make_mode("window", recent=3)
    assert option_names("full") == []
    with pytest.raises(ValueError, match="its options: none"):
        make_mode("full", ratio=0.5)


@pytest.mark.parametrize("name, options, message", [
    ("window", {"ratio": 0.0}, r"ratio must be a number in \(0, 1\]"),
    ("selective", {"ratio": 1.5}, r"ratio must be a number in \(0, 1\]"),
    ("selective", {"recent": 0}, r"recent must be an integer >= 1, got 0"),
    ("window", {"sinks": -1}, r"sinks must be an integer >= 0, got -1"),
    ("int8", {"residual": -2}, r"residual must be an integer >= 0"),
    ("int4", {"group_size": 7}, r"group_size must be even for int4"),
    ("int4", {"key_axis": "head"}, r"key_axis must be one of 'token', 'channel'; got 'head'"),
    ("shared", {"block_size": 0}, r"block_size must be an integer >= 1, got 0"),
    ("combo", {"bits": 2}, r"bits must be one of 8, 4; got 2"),
    ("combo", {"ratio": 2}, r"ratio must be a number in \(0, 1\]"),
])
def test_invalid_budgets_fail_at_construction(name: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_mode(name, **options)
