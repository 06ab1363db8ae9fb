"""Train the embedded couplet model: a small LlamaForCausalLM (grouped-query attention, rotary positions).

    python -m couplet.training.pairs --data ../shared/data/couplets_train.tsv.xz --out assets/model

Runs on CPU (float32) in about an hour on 2 cores with the default preset; reproducible from
`--seed` (same data order, same initialisation). `--device cuda --bf16 --minutes M` is the GPU run from scratch
of `scripts/train_gpu.sh` (`TRAIN_GPU_FROM=scratch`): with a wall-time budget the cosine schedule runs on the
time spent, as `couplet.training.context`'s does, and `--steps` is ignored. Progress shows loss, tokens/s and
ETA; the held-out `lvshi_mid` NLL (nats per character of 下联 given 上联) is evaluated periodically and at the end.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from couplet.models.scoring import joint_nll, lower_line_nll
from couplet.models.tokenizer import FORMATS, SPECIAL_TOKENS, build_tokenizer
from couplet.training.corpus import KINDS, Pair, is_heldout, make_batch, read_pairs, sample_keywords
from couplet.writing.phrases import HENGPI_PHRASES


@dataclass(frozen=True)
class ModelPreset:
    """Llama hyper-parameters; `small` is the embedded model, `tiny` the unit-test fixture."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int

    def llama_config(self, vocab_size: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
            pad_token_id=0, bos_token_id=2, eos_token_id=3,
        )


PRESETS = {
    "small": ModelPreset(256, 768, 6, 8, 2),
    "tiny": ModelPreset(64, 128, 2, 4, 2),
    # the size ablation: about small's parameters (6.9M against 6.3M) in 4 wider layers
    "wide4": ModelPreset(320, 960, 4, 10, 2),
}


@dataclass
class TrainConfig:
    data: str
    out: str = "assets/model"
    preset: str = "small"
    format: str = "lines"  # `FORMATS`: "interleaved" is the format ablation (上₁下₁上₂下₂…); the page reads "lines"
    vocab_size: int = 7000
    steps: int = 3600
    batch_size: int = 192
    lr: float = 2e-3
    warmup: int = 200
    weight_decay: float = 0.1
    # sampling weights of the corpus kinds: lvshi_mid pairs are the strictly parallel ones
    mix: dict[str, float] = field(default_factory=lambda: {"lvshi_mid": 0.55, "lvshi_edge": 0.15, "other": 0.30})
    eval_every: int = 600
    eval_pairs: int = 1000
    seed: int = 1234
    threads: int = 2
    bf16: bool = False  # bf16 autocast: 1.7 s a step in float32 against 59 s with it on this torch's CPU (measured)
    limit_rows: int | None = None  # for smoke runs
    device: str = "cpu"  # "cuda": `scripts/train_gpu.sh` with TRAIN_GPU_FROM=scratch
    minutes: float = 0.0  # > 0: train for this wall time (the schedule follows it) instead of `steps` steps

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose from {sorted(PRESETS)}")
        if self.format not in FORMATS:
            raise ValueError(f"unknown format {self.format!r}; choose from {tuple(FORMATS)}")
        if set(self.mix) - set(KINDS):
            raise ValueError(f"mix keys must be among {KINDS}")
        if self.minutes < 0:
            raise ValueError(f"minutes must be positive (or 0: run --steps), got {self.minutes}")


def lr_at(step: int, cfg: TrainConfig, progress: float | None = None) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 10% of the peak; `progress` in [0, 1] is the share
    of the budget spent (a wall-time budget), else the share of `steps` after the warm-up."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if progress is None:
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def save(model: LlamaForCausalLM, tok, out: Path, stats: dict) -> None:
    """Weights in bfloat16 (half the bytes; loaders upcast on CPU), tokenizer, and training stats."""
    out.mkdir(parents=True, exist_ok=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out)  # type: ignore[arg-type]
    tok.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(stats, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def main(cfg: TrainConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    t0 = time.time()

    by_kind: dict[str, list[Pair]] = {k: [] for k in KINDS}
    heldout: list[Pair] = []
    counts: Counter[str] = Counter()
    for i, pair in enumerate(read_pairs(cfg.data)):
        if cfg.limit_rows and i >= cfg.limit_rows:
            break
        if is_heldout(pair):
            heldout.append(pair)
            continue
        by_kind[pair.kind].append(pair)
        counts.update(pair.upper)
        counts.update(pair.lower)
    print(f"read {sum(map(len, by_kind.values()))} training pairs, {len(heldout)} held out "
          f"in {time.time() - t0:.0f}s", file=sys.stderr)

    tok = build_tokenizer(counts, cfg.vocab_size, must_include=HENGPI_PHRASES)
    vocab = tok.get_vocab()
    ids = {t: vocab[t] for t in SPECIAL_TOKENS}
    model = LlamaForCausalLM(PRESETS[cfg.preset].llama_config(len(vocab)))
    model.to(cfg.device)  # type: ignore[arg-type]  # transformers' stub types .to's argument as a model
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters, vocabulary {len(vocab)}", file=sys.stderr)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    kinds = [k for k in KINDS if by_kind[k] and cfg.mix.get(k, 0) > 0]
    weights = [cfg.mix[k] for k in kinds]
    eval_set = [(p.upper, p.lower) for p in heldout[: cfg.eval_pairs]]
    history: list[dict] = []
    tokens_seen = 0

    def evaluate(step: int) -> float:
        """The held-out NLL of 下联 given 上联 (the lines format's figure); both formats also record the
        joint NLL of the couplet (`joint_nll`), the one figure that compares them, and report it as theirs."""
        if not eval_set:  # a toy corpus may hold no held-out pair (1% by hash)
            history.append({"step": step, "val_nll_per_char": None, "joint_nll_per_char": None,
                            "minutes": round((time.time() - t0) / 60, 1)})
            return math.nan
        model.eval()
        joint = joint_nll(model, tok, eval_set, cfg.format)
        nll = sum(lower_line_nll(model, tok, eval_set)) / len(eval_set) if cfg.format == "lines" else joint
        model.train()
        history.append({"step": step, "val_nll_per_char": round(nll, 4), "joint_nll_per_char": round(joint, 4),
                        "minutes": round((time.time() - t0) / 60, 1)})
        return nll

    def stats(val: float) -> dict:
        return {"config": asdict(cfg), "steps_taken": done, "parameters": n_params, "vocab_size": len(vocab),
                "tokens_seen": tokens_seen, "train_minutes": round((time.time() - t0) / 60, 1),
                "heldout_pairs": len(heldout), "val_pairs": len(eval_set),
                "val_nll_per_char": None if math.isnan(val) else round(val, 4), "history": history,
                "data_source": "chinese-poetry/chinese-poetry (MIT), Tang and Song poems"}

    model.train()
    budget = cfg.minutes * 60
    bar = tqdm(itertools.count() if budget else range(cfg.steps), total=None if budget else cfg.steps,
               desc="train", dynamic_ncols=True, file=sys.stderr, mininterval=5)
    t_tok = time.time()
    ema = None
    build = FORMATS[cfg.format]  # the training sequence of one pair
    done = 0  # steps taken
    for step in bar:
        spent = time.time() - t_tok
        if budget and spent >= budget:
            break
        chosen = rng.choices(kinds, weights, k=cfg.batch_size)
        pairs = [rng.choice(by_kind[k]) for k in chosen]
        seqs = [build(tok, sample_keywords(p, rng), p.upper, p.lower) for p in pairs]
        inputs, labels = (t.to(cfg.device) for t in make_batch(seqs, ids["<pad>"], ids["<sep>"]))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg, spent / budget if budget else None)
        with torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = model(input_ids=inputs, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        tokens_seen += int((labels != -100).sum())
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{tokens_seen / (time.time() - t_tok):.0f}", refresh=False)
        if done % cfg.eval_every == 0 and (budget or done < cfg.steps):
            val = evaluate(done)
            bar.write(f"step {done}: held-out NLL {val:.3f} nats/char")
            save(model, tok, Path(cfg.out), stats(val))
    val = evaluate(done)
    result = stats(val)
    save(model, tok, Path(cfg.out), result)
    what = "下联 given 上联" if cfg.format == "lines" else "both lines, interleaved"
    print(f"done: held-out NLL {val:.3f} nats/char of {what} over {len(eval_set)} pairs, "
          f"{result['train_minutes']} min, {tokens_seen / 1e6:.1f}M tokens -> {cfg.out}", file=sys.stderr)
    return result


def add_config_args(p: argparse.ArgumentParser, defaults: object, names: tuple[str, ...]) -> None:
    """`--some-name` for each config field `some_name`, typed and defaulted by the field's default (an
    optional field that defaults to None takes an int)."""
    for name in names:
        value = getattr(defaults, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else int, default=value)


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    p = argparse.ArgumentParser(prog="python -m couplet.training.pairs", description=__doc__.split("\n")[0])
    defaults = TrainConfig(data="")
    p.add_argument("--data", required=True, help="path to couplets_train.tsv.xz (read, never copied)")
    add_config_args(p, defaults, ("out", "preset", "format", "vocab_size", "steps", "batch_size", "lr", "warmup",
                                  "eval_every", "eval_pairs", "seed", "threads", "limit_rows", "device", "minutes"))
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (for a GPU; far slower on CPU)")
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="float32 (the default)")
    return TrainConfig(**vars(p.parse_args(argv)))


if __name__ == "__main__":
    try:
        main(parse_args())
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
