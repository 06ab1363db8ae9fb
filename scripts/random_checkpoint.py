"""A random-weight checkpoint at a real model's shape, with this project's tokenizer — memory and throughput
at a realistic scale without a download (its couplets are well-formed by the constraints, not good).

    python scripts/random_checkpoint.py --shape qwen2.5-0.5b --out /tmp/qwen-0.5b-shape
    python -m couplet.bench serve --model /tmp/qwen-0.5b-shape --device cuda --visitors 1000
    python scripts/random_checkpoint.py --shape palm2.0-base --out /tmp/palm-base-shape   # ModelScope's PALM layout
    python -m couplet.bench --model /tmp/palm-base-shape --modes all --reps 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

import torch  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from couplet.models.loading import EMBEDDED_MODEL  # noqa: E402

# Qwen/Qwen2.5-0.5B's config.json (architecture only; the vocabulary is ours); "small" is a CPU-sized cut
SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, rope_theta=1_000_000.0),
    "small": dict(hidden_size=448, intermediate_size=1216, num_hidden_layers=8, num_attention_heads=7,
                  num_key_value_heads=1, rope_theta=1_000_000.0),
}


PALM = "palm2.0-base"  # PALM's base size (`couplet.models.palm.BASE_SHAPE`), the vocabulary our Han characters


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted([*SHAPES, PALM]), default="qwen2.5-0.5b")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    tok = AutoTokenizer.from_pretrained(EMBEDDED_MODEL)
    if args.shape == PALM:
        from couplet.models.palm import BASE_SHAPE, save_random_palm
        from couplet.writing.text import is_han

        chars = sorted(t for t in tok.get_vocab() if len(t) == 1 and is_han(t))
        save_random_palm(args.out, chars, BASE_SHAPE, args.seed)
        state = torch.load(Path(args.out) / "pytorch_model.bin", weights_only=True)
        n = sum({t.data_ptr(): t.numel() for t in state.values()}.values())  # tied tensors once
        print(f"{args.shape}: {n / 1e6:.0f}M values in the checkpoint ({len(chars)} characters), "
              f"{BASE_SHAPE['dec_layers']} decoder layers x {BASE_SHAPE['dec_hidden_size']} -> {args.out}")
        return 0
    config = Qwen2Config(vocab_size=len(tok.get_vocab()), max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         **SHAPES[args.shape])
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.shape}: {n / 1e6:.0f}M parameters, {config.num_hidden_layers} layers, "
          f"{config.num_key_value_heads} KV heads x {config.hidden_size // config.num_attention_heads} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
