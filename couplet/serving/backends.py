"""Where couplets are decoded: `local` (this process's engine, every KV-cache mode in `couplet.kvcache`) or
`vllm` (a vLLM OpenAI-compatible server, `couplet.vllm_backend.client`, started by scripts/vllm_serve.sh).

    COUPLET_BACKEND=vllm COUPLET_VLLM_URL=http://127.0.0.1:8000 python app.py
    python -m couplet 龙马精神 --backend vllm --vllm-url http://127.0.0.1:8000
    python -m couplet.bench serve --backend vllm --budgets 2

With `vllm`, the page offers the server's own mode beside the in-process ones: full-precision or FP8 KV (as
the server was started) with its prefix caching. The window, selective, INT8/INT4 and combo modes exist only
in-process and are labelled so; there is no pretend vLLM equivalent of them.

Light on imports: the vLLM server imports `couplet.vllm_backend.logits` from its own environment.
"""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

BACKENDS = ("local", "vllm")
VLLM_MODE = "vllm"  # the mode name of the vLLM server's couplets in records, results, the chart and the table
# vLLM's own environment (scripts/vllm_serve.sh creates it; the benchmark and the tests find it here)
VLLM_VENV = Path(os.environ.get("COUPLET_VLLM_VENV", Path.home() / ".cache" / "couplet" / "vllm-venv"))


class BackendError(RuntimeError):
    """The remote engine failed; `str(e)`: Chinese for the visitor, then the English detail in parentheses."""

DEFAULT_VLLM_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class BackendConfig:
    name: str = "local"
    vllm_url: str = DEFAULT_VLLM_URL

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(f"未知后端「{self.name}」，可选：{'、'.join(BACKENDS)}。 "
                             f"(unknown backend {self.name!r}; choose from {', '.join(BACKENDS)})")
        try:
            url = urlsplit(self.vllm_url)
            url.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            url = urlsplit("")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"vLLM 服务地址「{self.vllm_url}」无效，应形如 {DEFAULT_VLLM_URL}。 "
                             f"(invalid vLLM URL {self.vllm_url!r})")

    @classmethod
    def from_env(cls) -> BackendConfig:
        """`COUPLET_BACKEND` (local|vllm) and `COUPLET_VLLM_URL`."""
        return cls(os.environ.get("COUPLET_BACKEND", "local").strip().lower() or "local",
                   os.environ.get("COUPLET_VLLM_URL", DEFAULT_VLLM_URL).strip() or DEFAULT_VLLM_URL)


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """`--backend` and `--vllm-url`, defaulting to the environment (the CLI and the benchmark); a bad
    environment is the parser's error, one line."""
    try:
        env = BackendConfig.from_env()
    except ValueError as e:
        p.error(f"COUPLET_BACKEND/COUPLET_VLLM_URL: {e}")
    p.add_argument("--backend", choices=BACKENDS, default=env.name,
                   help="local: this process's engine; vllm: a vLLM server (default $COUPLET_BACKEND or local)")
    p.add_argument("--vllm-url", default=env.vllm_url, help=f"the vLLM server (default $COUPLET_VLLM_URL or "
                                                             f"{DEFAULT_VLLM_URL}; the benchmark starts its own "
                                                             "servers unless given one)")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (servers started for a run: the benchmark, the tests, the app)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
