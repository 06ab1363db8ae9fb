"""Where a model comes from (`couplet.models.hub`, `couplet.models.loading`):
a folder, a Hugging Face id found in a real
hub cache (huggingface_hub's own lookup, no network), ModelScope — and what happens offline.

The only mocks: `_hf_download` / `_modelscope_download` replaced by functions that fail the way a download
fails on a machine without network (downloads cannot happen here). They are named `offline_*`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from couplet.models import hub
from couplet.models.hub import ModelUnavailable, parse_source, resolve
from couplet.models.loading import EMBEDDED_MODEL, UnsupportedModel, load_model, load_model_or_embedded


def offline_download(name: str, local_files_only: bool) -> str:
    """MOCK of a hub download on a machine without network: the cache misses, the network fails."""
    if local_files_only:
        raise FileNotFoundError(f"{name} is not in the local cache")
    raise ConnectionError("Name or service not known")


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setitem(hub.DOWNLOADS, "huggingface", offline_download)
    monkeypatch.setitem(hub.DOWNLOADS, "modelscope", offline_download)


def test_sources_are_parsed_by_their_form(tmp_path):
    assert parse_source(str(tmp_path)).hub == "local"
    assert parse_source("Qwen/Qwen2.5-0.5B-Instruct") == hub.Source("Qwen/Qwen2.5-0.5B-Instruct", "huggingface",
                                                                     "Qwen/Qwen2.5-0.5B-Instruct")
    assert parse_source("hf:uer/gpt2-chinese-couplet").name == "uer/gpt2-chinese-couplet"
    assert parse_source("modelscope:Qwen/Qwen2.5-1.5B-Instruct") == hub.Source(
        "modelscope:Qwen/Qwen2.5-1.5B-Instruct", "modelscope", "Qwen/Qwen2.5-1.5B-Instruct")
    with pytest.raises(ModelUnavailable, match="既不是本地文件夹"):
        parse_source("no-such-model")


def test_a_hub_id_loads_from_the_real_hugging_face_cache(tiny_checkpoint, tmp_path, monkeypatch):
    """The cache layout huggingface_hub writes (refs/main → snapshots/<commit>/), filled with the tiny
    checkpoint: `snapshot_download(local_files_only=True)` finds it, and the model loads through the same
    path a download would take."""
    from huggingface_hub import constants

    commit = "0" * 40
    repo = tmp_path / "models--tiny--couplet"
    shutil.copytree(tiny_checkpoint, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert Path(resolve("tiny/couplet")) == repo / "snapshots" / commit
    lm = load_model("tiny/couplet", device="cpu", dtype="float32")
    assert lm.source.endswith(commit) and lm.weight_bytes > 0


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B-Instruct", "modelscope:Qwen/Qwen2.5-1.5B-Instruct"])
def test_offline_a_hub_model_fails_fast_naming_what_was_tried(offline, spec):
    t0 = time.perf_counter()
    with pytest.raises(ModelUnavailable) as e:
        resolve(spec)
    assert time.perf_counter() - t0 < 3 * hub.PROBE_SECONDS + 2  # no retries with back-off, no hang
    message = str(e.value)
    assert message.startswith(f"无法获取模型「{spec}」") and "local cache: not there" in message
    assert "network:" in message or "download:" in message


def test_the_app_falls_back_to_the_embedded_model_with_a_notice(offline):
    lm, notice = load_model_or_embedded("modelscope:nobody/none", device="cpu", dtype="float32")
    assert Path(lm.source) == EMBEDDED_MODEL
    assert notice.startswith("未能加载模型「modelscope:nobody/none」") and notice.endswith("已改用内置小模型。")
    lm, notice = load_model_or_embedded(str(EMBEDDED_MODEL), device="cpu", dtype="float32")
    assert notice == ""


def test_a_checkpoint_of_an_unsupported_family_is_refused_and_the_app_falls_back(tmp_path):
    """A GPT-2 with a BERT vocabulary but no line separator "-": no family this project can prompt."""
    from test_families import BERT_SPECIALS, make_gpt2_couplet

    path = make_gpt2_couplet(tmp_path / "m", specials=[t for t in BERT_SPECIALS if t != "-"])
    with pytest.raises(UnsupportedModel, match="暂不支持"):
        load_model(str(path), device="cpu")
    lm, notice = load_model_or_embedded(str(path), device="cpu", dtype="float32")
    assert Path(lm.source) == EMBEDDED_MODEL and "暂不支持" in notice


def test_weight_quantization_is_refused_on_cpu_with_a_reason():
    with pytest.raises(ValueError, match="需要 CUDA"):
        load_model(device="cpu", weights="nf4")
    with pytest.raises(ValueError, match="unknown --weights"):
        load_model(device="cpu", weights="int3")
    cli = subprocess.run([sys.executable, "-m", "couplet", "龙马精神", "--device", "cpu", "--weights", "int8"],
                         capture_output=True, text=True, check=False)
    assert cli.returncode == 2 and cli.stdout == "" and cli.stderr.count("\n") == 1
    assert "--weights int8 需要 CUDA" in cli.stderr


def test_int8_weights_log_the_bitsandbytes_cast_note_once(caplog):
    """bitsandbytes logs its bf16 -> fp16 cast at every int8 matmul (2,520 lines in one GPU check): the int8
    config keeps the first and drops the rest; other records of that logger pass."""
    import logging

    import torch

    from couplet.models.loading import quantization_config

    config = quantization_config("int8", "cuda", torch.bfloat16)  # builds the config only: no GPU needed
    assert config.load_in_8bit
    log = logging.getLogger("bitsandbytes.autograd._functions")
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(3):
            log.warning("MatMul8bitLt: inputs will be cast from %s to float16 during quantization", torch.bfloat16)
        log.warning("something else")
    messages = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert messages[-1] == "something else" and sum("inputs will be cast" in m for m in messages) <= 1


def test_dtype_halves_the_weights():
    full = load_model(device="cpu", dtype="float32")
    half = load_model(device="cpu", dtype="bfloat16")
    assert half.weight_bytes == pytest.approx(full.weight_bytes / 2, rel=0.01)
