"""Where couplets are decoded: `local` (this process's engine, every KV-cache mode in `couplet.kvcache`) or
`vllm` (a vLLM OpenAI-compatible server, `couplet.serving.vllm_client`, started by scripts/vllm_serve.sh).

    COUPLET_BACKEND=vllm COUPLET_VLLM_URL=http://127.0.0.1:8000 python app.py
    python -m couplet 龙马精神 --backend vllm --vllm-url http://127.0.0.1:8000
    python -m couplet.bench serve --backend vllm --budgets 2

With `vllm`, the page offers the server's own mode beside the in-process ones: full-precision or FP8 KV (as
the server was started) with its prefix caching. The window, selective, INT8/INT4 and combo modes exist only
in-process and are labelled so; there is no pretend vLLM equivalent of them.

Light on imports: the vLLM server imports `couplet.serving.vllm_logits` from its own environment.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

BACKENDS = ("local", "vllm")


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

    @classmethod
    def from_env(cls) -> BackendConfig:
        """`COUPLET_BACKEND` (local|vllm) and `COUPLET_VLLM_URL`."""
        return cls(os.environ.get("COUPLET_BACKEND", "local").strip().lower() or "local",
                   os.environ.get("COUPLET_VLLM_URL", DEFAULT_VLLM_URL))


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """`--backend` and `--vllm-url`, defaulting to the environment (the CLI and the benchmark)."""
    env = BackendConfig.from_env() if os.environ.get("COUPLET_BACKEND", "local") in BACKENDS else BackendConfig()
    p.add_argument("--backend", choices=BACKENDS, default=env.name,
                   help="local: this process's engine; vllm: a vLLM server (default $COUPLET_BACKEND or local)")
    p.add_argument("--vllm-url", default=env.vllm_url, help=f"the vLLM server (default $COUPLET_VLLM_URL or "
                                                             f"{DEFAULT_VLLM_URL})")
