"""Where a model comes from: a local folder, a Hugging Face id, or `modelscope:ORG/NAME` — one code path.

    resolve("assets/model")                          # a folder: used as it is
    resolve("Qwen/Qwen2.5-0.5B-Instruct")            # Hugging Face (also "hf:Qwen/…")
    resolve("modelscope:Qwen/Qwen2.5-1.5B-Instruct") # ModelScope, the usual route where huggingface.co is not

Each hub is tried the same way: its local cache first (no network at all), then a reachability probe of
its host (a few seconds), then the download. So an offline machine fails fast — the hubs' own clients
retry with back-off (ModelScope's takes ~25 s to give up on a missing network) — with one message that
names everything tried. `_hf_download` and `_modelscope_download` are the only functions that touch the
network; the tests replace them (named as mocks of downloads that cannot happen here).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

PROBE_SECONDS = 3.0
DTYPE_NAMES = ("float32", "bfloat16", "float16")
WEIGHTS = ("int8", "nf4")  # bitsandbytes weight quantization (CUDA only)
HOSTS = {"huggingface": "https://huggingface.co", "modelscope": "https://www.modelscope.cn"}
ENDPOINT_ENV = {"huggingface": "HF_ENDPOINT", "modelscope": "MODELSCOPE_DOMAIN"}
LABELS = {"huggingface": "Hugging Face", "modelscope": "ModelScope"}


class ModelUnavailable(RuntimeError):
    """A model that cannot be had: the message names what was tried (Chinese first, English after)."""


@dataclass(frozen=True)
class Source:
    spec: str  # what was asked for
    hub: str  # local | huggingface | modelscope
    name: str  # the folder, or ORG/NAME on the hub


def parse_source(spec: str) -> Source:
    spec = spec.strip()
    if spec.startswith("modelscope:"):
        return Source(spec, "modelscope", spec.removeprefix("modelscope:"))
    if spec.startswith("hf:"):
        return Source(spec, "huggingface", spec.removeprefix("hf:"))
    if Path(spec).expanduser().exists():
        return Source(spec, "local", str(Path(spec).expanduser()))
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return Source(spec, "huggingface", spec)
    raise ModelUnavailable(f"找不到模型「{spec}」：既不是本地文件夹，也不是 ORG/NAME 形式的模型名。 "
                           f"(model {spec!r}: not a local folder, a hub id ORG/NAME, or modelscope:ORG/NAME)")


def _hf_download(name: str, local_files_only: bool) -> str:
    from huggingface_hub import snapshot_download

    return str(snapshot_download(name, local_files_only=local_files_only, etag_timeout=PROBE_SECONDS))


def _modelscope_download(name: str, local_files_only: bool) -> str:
    from modelscope import snapshot_download  # imported lazily: only this route needs it

    return str(snapshot_download(name, local_files_only=local_files_only))


DOWNLOADS = {"huggingface": _hf_download, "modelscope": _modelscope_download}


def reachable(hub: str, timeout: float = PROBE_SECONDS) -> str | None:
    """None if the hub's host answers a TCP connection within `timeout`; else why not (one line)."""
    url = os.environ.get(ENDPOINT_ENV[hub]) or HOSTS[hub]
    if "://" not in url:
        url = "https://" + url
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host}:{port} unreachable ({type(e).__name__}: {e})"


def resolve(spec: str) -> str:
    """A local folder holding the model named by `spec`; raises ModelUnavailable naming what was tried."""
    source = parse_source(spec)
    if source.hub == "local":
        return source.name
    label, download = LABELS[source.hub], DOWNLOADS[source.hub]
    tried = []
    try:
        return download(source.name, True)
    except Exception as e:  # noqa: BLE001  (each client raises its own kinds; all mean "not cached")
        tried.append(f"{label} local cache: not there ({type(e).__name__})")
    if os.environ.get("HF_HUB_OFFLINE") == "1" and source.hub == "huggingface":
        tried.append("network: HF_HUB_OFFLINE=1")
    elif (why := reachable(source.hub)) is not None:
        tried.append(f"network: {why}")
    else:
        try:
            return download(source.name, False)
        except Exception as e:  # noqa: BLE001
            tried.append(f"{label} download: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    raise ModelUnavailable(f"无法获取模型「{spec}」（{label}）：本机缓存中没有，网络也取不到。 "
                           f"(model {spec!r} unavailable; tried: {'; '.join(tried)})")


def add_model_args(p, dtype_default: str | None = None) -> None:
    """`--model`, `--device`, `--dtype`, `--weights`: the same four options for the CLI, evaluate and bench
    (here, not in `couplet.models.loading`, so that parsing arguments imports no torch)."""
    p.add_argument("--model", default=None,
                   help="a folder, a Hugging Face id, or modelscope:ORG/NAME (default: $COUPLET_MODEL or the embedded)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=dtype_default, choices=DTYPE_NAMES)
    p.add_argument("--weights", default=None, choices=WEIGHTS, help="bitsandbytes weight quantization (CUDA only)")
