"""Real vLLM CPU servers for tests/test_vllm_integration.py, started with scripts/vllm_serve.sh on the embedded
checkpoint at a tiny KV budget: one with a bf16 KV cache, one with fp8, at the same budget in bytes.

They take about a minute to start (three processes import vLLM), so conftest.py starts them in the background
when the session begins (if the integration tests were collected) and the fixtures wait for them; they are
stopped when the session ends. The separate environment comes from `scripts/vllm_serve.sh --setup-only`, which
the README's test command runs first (and then sets COUPLET_VLLM_REQUIRED=1: a missing environment fails the
run instead of skipping it).
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "vllm_serve.sh"
VENV = Path(os.environ.get("COUPLET_VLLM_VENV", Path.home() / ".cache" / "couplet" / "vllm-venv"))
KV_BYTES = 2 * 1024 * 1024  # 2 MiB: 42 blocks of 32 tokens in bf16 for the embedded model, about 3 requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment_ready() -> bool:
    return (VENV / ".couplet-ready").is_file()


def fp8_kv_supported() -> bool:
    """vLLM's CPU attention has an FP8 KV cache only on x86 with AVX-512 or AMX (it raises NotImplementedError at
    start-up otherwise: `vllm/v1/attention/backends/cpu_attn.py`); an AVX2-only CPU cannot run that server."""
    import torch

    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


@dataclass
class Server:
    kv_dtype: str
    port: int
    process: subprocess.Popen | None = None  # the script, until the server answers /health
    url: str = ""
    error: str = ""

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["bash", str(SCRIPT), "--detach", "--port", str(self.port), "--kv-bytes", str(KV_BYTES),
             "--kv-dtype", self.kv_dtype, "--max-num-seqs", "16"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait(self) -> str:
        """The server's URL once healthy; raises RuntimeError with the script's last words otherwise."""
        if self.process is not None:
            out, err = self.process.communicate(timeout=600)
            if self.process.returncode == 0:
                self.url = out.strip().splitlines()[-1]
            else:
                self.error = err.strip()[-2000:]
            self.process = None
        if not self.url:
            raise RuntimeError(f"vLLM ({self.kv_dtype}) did not start: {self.error}")
        return self.url

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
        subprocess.run(["bash", str(SCRIPT), "--stop", "--port", str(self.port)], cwd=ROOT, capture_output=True)


SERVERS: dict[str, Server] = {}


def start_all() -> None:
    """Start the bf16 and the fp8 server (once per session), without waiting."""
    if SERVERS or not environment_ready():
        return
    for dtype in ("auto", "fp8") if fp8_kv_supported() else ("auto",):
        SERVERS[dtype] = Server(dtype, free_port())
        SERVERS[dtype].start()


def stop_all() -> None:
    for server in SERVERS.values():
        server.stop()
    SERVERS.clear()
