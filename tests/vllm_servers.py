"""Real vLLM CPU servers for tests/test_vllm_integration.py, started with scripts/vllm_serve.sh (through the
benchmark's `couplet.bench.vllm.Server`) on the embedded checkpoint at a tiny KV budget: one with a bf16 KV
cache, and one with fp8 at the same budget in bytes where this machine can run it.

They take about a minute to start (three processes import vLLM), so conftest.py starts them in the background
when the session begins (if the integration tests were collected) and the fixtures wait for them; they are
stopped when the session ends. The separate environment comes from `scripts/vllm_serve.sh --setup-only`, which
the README's test command runs first (and then sets COUPLET_VLLM_REQUIRED=1: a missing environment fails the
run instead of skipping it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from couplet.bench.vllm import ROOT, Server
from couplet.serving.backends import VLLM_VENV, free_port

KV_BYTES = 2 * 1024 * 1024  # 2 MiB: 42 blocks of 32 tokens in bf16 for the embedded model, about 3 requests
SERVERS: dict[str, Server] = {}
__all__ = ["KV_BYTES", "ROOT", "SERVERS", "environment_ready", "fp8_kv_supported", "page_on", "start_all",
           "stop_all", "url"]


def environment_ready() -> bool:
    return (VLLM_VENV / ".couplet-ready").is_file()


def fp8_kv_supported() -> bool:
    """vLLM's CPU attention has an FP8 KV cache only on x86 with AVX-512 or AMX (it raises NotImplementedError at
    start-up otherwise: `vllm/v1/attention/backends/cpu_attn.py`); an AVX2-only CPU cannot run that server."""
    import torch

    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def start_all() -> None:
    """Start the bf16 (and, where it can run, the fp8) server once per session, without waiting."""
    if SERVERS or not environment_ready():
        return
    for dtype in ("bf16", "fp8") if fp8_kv_supported() else ("bf16",):
        SERVERS[dtype] = Server(KV_BYTES, dtype, max_num_seqs=16).start()


def url(dtype: str) -> str:
    """The server's URL once healthy; raises RuntimeError with the script's last words otherwise."""
    start_all()
    server = SERVERS[dtype]
    if not server.wait():
        raise RuntimeError(f"vLLM ({dtype}) did not start: {server.refusal}")
    return server.url


@contextmanager
def page_on(vllm_url: str) -> Iterator[str]:
    """`COUPLET_BACKEND=vllm python app.py` on that server, at a free port: its URL once it answers (raises
    RuntimeError with its stderr if it exits first); terminated afterwards. The integration test and
    scripts/screenshot_vllm.py use it."""
    port = free_port()
    env = {**os.environ, "COUPLET_BACKEND": "vllm", "COUPLET_VLLM_URL": vllm_url, "GRADIO_SERVER_PORT": str(port)}
    page = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        for _ in range(240):
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if page.poll() is not None:
                raise RuntimeError(f"app.py exited: {page.stderr.read() if page.stderr else ''}")
            time.sleep(0.5)
        yield url
    finally:
        page.terminate()
        page.wait(timeout=30)


def stop_all() -> None:
    for server in SERVERS.values():
        server.stop()
    SERVERS.clear()
