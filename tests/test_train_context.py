"""Stage-2 training: the sequences the sampler builds, and a real (tiny, seconds-long) run that resumes."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from couplet.models.tokenizer import FormatIds
from couplet.training.context import ContextSampler, ContextTrainConfig, batch, main
from couplet.training.corpus import Pair
from couplet.training.pairs import PRESETS
from couplet.writing.exemplars import STORE, load_store, read_store
from couplet.writing.lexicon import style_of
from couplet.writing.prompt import house_ids


def _pairs() -> list[Pair]:
    store = read_store(STORE)
    return [Pair(u, lo, "lvshi_mid") for u, lo in store[:400]] + [
        Pair("万里悲秋常作客", "百年多病独登台", "lvshi_mid"),  # taboo: never a target, never in a pack
        Pair("春风不度玉门关", "明月何曾照故乡", "other")]


def test_sampler_builds_inference_shaped_sequences(embedded_lm):
    tok = embedded_lm.tokenizer
    f = FormatIds.of(tok)
    cfg = ContextTrainConfig(data="", p_house=0.5, p_bare=0.1)
    sampler = ContextSampler(tok, _pairs(), load_store(), cfg, random.Random(0))
    assert "lvshi_mid/taboo" not in sampler.counts
    house = house_ids(tok)
    kinds = {"house": 0, "pack": 0, "bare": 0}
    for _ in range(60):
        s = sampler.sample()
        assert len(s.ids) == len(s.loss) and s.ids[0] == f.bos and len(s.ids) <= 512
        assert s.ids[-1] == f.eos and s.loss[-1]  # the target's body carries loss
        if s.ids[1 : 1 + len(house)] == house:
            kinds["house"] += 1
            assert not any(s.loss[1 : 1 + len(house)])  # the constant house prefix is never learned
        elif s.ids.count(f.eos) == 1:
            kinds["bare"] += 1
        else:
            kinds["pack"] += 1
        # the loss sits on couplet bodies only: never on a length tag, keywords or <sep>
        assert not any(s.loss[i] for i, t in enumerate(s.ids) if t in (f.sep, *f.length.values()))
    assert all(kinds.values()), kinds
    text = lambda s: "".join(tok.convert_ids_to_tokens(s.ids))  # noqa: E731
    assert all("悲" not in text(sampler.sample()) for _ in range(30))
    inputs, labels = batch([sampler.sample() for _ in range(4)], f.pad)
    assert inputs.shape == labels.shape and (labels != -100).any()
    assert style_of("万里悲秋常作客百年多病独登台") == "taboo"


def test_a_tiny_run_checkpoints_and_resumes(tmp_path, tiny_checkpoint):
    data = tmp_path / "pairs.tsv"
    data.write_text("upper\tlower\tera\tkind\n" + "".join(
        f"{p.upper}\t{p.lower}\ttang\t{p.kind}\n" for p in _pairs()), encoding="utf-8")
    cfg = dict(data=str(data), init=str(tiny_checkpoint), out=str(tmp_path / "model"),
               state=str(tmp_path / "state.pt"), minutes=0.05, batch_size=4, threads=1, eval_pairs=0)
    first = main(ContextTrainConfig(**cfg))
    assert first["steps"] >= 1 and (tmp_path / "state.pt").exists()
    saved = json.loads((tmp_path / "model" / "training.json").read_text(encoding="utf-8"))
    assert saved["stage"] == 2 and saved["steps"] == first["steps"]
    elapsed = torch.load(tmp_path / "state.pt", weights_only=False)["elapsed"]
    second = main(ContextTrainConfig(**{**cfg, "minutes": elapsed / 60 + 0.05, "resume": True}))
    assert second["steps"] > first["steps"]  # continued, not restarted
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    assert state["step"] == second["steps"]


@pytest.mark.parametrize("start", ["scratch", "continue"])
def test_train_gpu_script_rehearses_on_cpu(tmp_path, start):
    """scripts/train_gpu.sh at toy size on CPU (its rehearsal): trains, saves a loadable model, writes a couplet.
    From scratch, stage 1 builds a new model of its own shape (the toy's: 2 layers) that the long prompt stage
    then continues; `continue` starts from the shipped model and keeps its shape."""
    import os
    import subprocess

    data = tmp_path / "pairs.tsv"
    data.write_text("upper\tlower\tera\tkind\n" + "".join(
        f"{p.upper}\t{p.lower}\ttang\t{p.kind}\n" for p in _pairs()), encoding="utf-8")
    out = tmp_path / "run"
    env = {**os.environ, "DATA": str(data), "TRAIN_GPU_DEVICE": "cpu", "TRAIN_GPU_QUICK": "1",
           "TRAIN_GPU_MINUTES": "0.08" if start == "scratch" else "0.05", "TRAIN_GPU_FROM": start}
    done = subprocess.run(["bash", "scripts/train_gpu.sh", str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (out / "model" / "model.safetensors").exists() and (out / "state.pt").exists()
    log = (out / "train_gpu.log").read_text(encoding="utf-8")
    assert "=== done" in log and log.count("passed") == 2  # both check couplets pass the rules
    stats = json.loads((out / "model" / "training.json").read_text(encoding="utf-8"))
    assert stats["config"]["device"] == "cpu"
    layers = json.loads((out / "model" / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
    if start == "scratch":
        stage1 = json.loads((out / "stage1" / "training.json").read_text(encoding="utf-8"))
        assert stage1["steps_taken"] > 0 and stage1["config"]["minutes"] > 0  # a wall-time budget, not steps
        assert stats["config"]["init"] == str(out / "stage1") and layers == PRESETS["tiny"].num_hidden_layers
    else:
        assert stats["config"]["init"] == "assets/model" and "stage1" not in {p.name for p in out.iterdir()}
        assert layers == json.loads(Path("assets/model/config.json").read_text(encoding="utf-8"))["num_hidden_layers"]


def test_the_format_ablation_trains_both_formats_and_scores_them_on_one_figure(tmp_path, embedded_lm):
    """Issue 29's format ablation (`couplet.training.pairs --format`): the interleaved sequence puts each 下联
    character right after its counterpart; a tiny run of either format learns (its joint NLL, the figure that
    compares them, falls), and the joint NLL of a lines-format model is the mean of its per-character NLLs."""
    from couplet.models.scoring import joint_nll, lower_line_nll
    from couplet.models.tokenizer import FORMATS, interleaved_ids
    from couplet.training.pairs import TrainConfig
    from couplet.training.pairs import main as train_pairs

    tok = embedded_lm.tokenizer
    f = FormatIds.of(tok)
    ids = interleaved_ids(tok, "", "春风送暖来", "明月照人归")
    assert tok.convert_ids_to_tokens(ids[3:7]) == ["春", "明", "风", "月"] and ids[2] == f.sep and ids[-1] == f.eos
    pairs = [(p.upper, p.lower) for p in _pairs()[:40]]
    lines = joint_nll(embedded_lm.model, tok, pairs, "lines")
    lower = sum(lower_line_nll(embedded_lm.model, tok, pairs)) / len(pairs)
    assert lower < lines  # the 上联 (given nothing but the length) is the harder half
    from couplet.training.corpus import is_heldout

    # the store never holds a held-out pair: recombined lines give the run its held-out set (1% by hash)
    train = _pairs()
    mixed = (Pair(a.upper, b.lower, "lvshi_mid") for a in train[:200] for b in train[200:400]
             if len(a.upper) == len(b.lower))
    heldout = [p for p in mixed if is_heldout(p)][:40]
    data = tmp_path / "pairs.tsv"
    data.write_text("upper\tlower\tera\tkind\n" + "".join(
        f"{p.upper}\t{p.lower}\ttang\t{p.kind}\n" for p in train * 3 + heldout), encoding="utf-8")
    for fmt in FORMATS:
        result = train_pairs(TrainConfig(data=str(data), out=str(tmp_path / fmt), preset="tiny", format=fmt,
                                         vocab_size=2000, steps=40, batch_size=32, lr=3e-3, warmup=4, eval_every=20,
                                         eval_pairs=40, threads=1, bf16=False))
        history = result["history"]  # at steps 20 and 40; a uniform guess scores log(vocabulary)
        assert history[-1]["joint_nll_per_char"] < history[0]["joint_nll_per_char"], (fmt, history)
        assert history[-1]["joint_nll_per_char"] < math.log(result["vocab_size"]) - 0.5, (fmt, history)
