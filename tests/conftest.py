"""Shared test fixtures: tiny random-weight causal LMs built from configs (no downloads, seeded).

`tiny_llama`, `tiny_qwen2` (rotary, grouped-query attention: 4 query heads over 2 KV heads) and
`tiny_gpt2` (learned absolute positions) have vocab 64, hidden 32, 2 layers, float32, eval mode.
`tiny_causal_lm` runs a test once per architecture. `live_app` launches the real page once per module.
"""

from __future__ import annotations

import pytest
import torch
from tiny_model import embedded_lm, tiny_checkpoint, tiny_lm  # noqa: F401  (fixtures for the whole suite)

TINY_VOCAB = 64


def build_tiny_lm(arch: str, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A tiny random causal LM of architecture `arch` ("llama", "qwen2" or "gpt2")."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = {"vocab_size": TINY_VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=TINY_VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=64,
                                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                           bos_token_id=1, eos_token_id=2))
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}")
    return model.eval()


@pytest.fixture(scope="session")
def tiny_llama() -> torch.nn.Module:
    return build_tiny_lm("llama")


@pytest.fixture(scope="session")
def tiny_qwen2() -> torch.nn.Module:
    return build_tiny_lm("qwen2")


@pytest.fixture(scope="session")
def tiny_gpt2() -> torch.nn.Module:
    return build_tiny_lm("gpt2")


@pytest.fixture(scope="session", params=["llama", "qwen2", "gpt2"])
def tiny_causal_lm(request: pytest.FixtureRequest) -> torch.nn.Module:
    return request.getfixturevalue(f"tiny_{request.param}")


@pytest.fixture(scope="module")
def live_app():
    """The real page (`app.build_app`) queued as in production and launched on 127.0.0.1 at a free port,
    once per test module; yields its URL ("http://127.0.0.1:PORT/") and closes it afterwards."""
    import app  # imported here: gradio is slow to import and only the app tests need it

    threads = torch.get_num_threads()  # build_app sets the serving thread count; give the next module its own
    demo = app.serve(port=0)
    app.warmed.wait(120)  # its start-up couplet written, as before a real visitor comes (tested in test_app_api)
    try:
        yield demo.local_url
    finally:
        demo.close()
        torch.set_num_threads(threads)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the real vLLM servers in the background as soon as their tests are collected: they take a minute
    to start, while the rest of the suite runs (tests/vllm_servers.py)."""
    if any("test_vllm_integration" in item.nodeid for item in session.items):
        import vllm_servers

        vllm_servers.start_all()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import sys

    if "vllm_servers" in sys.modules:
        sys.modules["vllm_servers"].stop_all()
