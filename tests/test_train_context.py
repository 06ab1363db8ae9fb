"""Stage-2 training: the sequences the sampler builds, and a real (tiny, seconds-long) run that resumes."""

from __future__ import annotations

import json
import random

import torch

from couplet.models.tokenizer import FormatIds
from couplet.training.context import ContextSampler, ContextTrainConfig, batch, main
from couplet.training.corpus import Pair
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


def test_train_gpu_script_rehearses_on_cpu(tmp_path):
    """scripts/train_gpu.sh at toy size on CPU (its rehearsal): trains, saves a loadable model, writes a couplet."""
    import os
    import subprocess

    data = tmp_path / "pairs.tsv"
    data.write_text("upper\tlower\tera\tkind\n" + "".join(
        f"{p.upper}\t{p.lower}\ttang\t{p.kind}\n" for p in _pairs()), encoding="utf-8")
    out = tmp_path / "run"
    env = {**os.environ, "DATA": str(data), "TRAIN_GPU_DEVICE": "cpu", "TRAIN_GPU_QUICK": "1",
           "TRAIN_GPU_MINUTES": "0.05"}
    done = subprocess.run(["bash", "scripts/train_gpu.sh", str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (out / "model" / "model.safetensors").exists() and (out / "state.pt").exists()
    log = (out / "train_gpu.log").read_text(encoding="utf-8")
    assert "=== done" in log and log.count("passed") == 2  # both check couplets pass the rules
    assert json.loads((out / "model" / "training.json").read_text(encoding="utf-8"))["config"]["device"] == "cpu"
