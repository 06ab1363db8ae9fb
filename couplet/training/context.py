"""Stage 2: fine-tune the embedded model on the long prompt, so that it writes in context.

    python -m couplet.training.context --data ../shared/data/couplets_train.tsv.xz --init assets/model \\
        --out assets/model --minutes 100            # add --resume to continue an interrupted run

Starting from the stage-1 checkpoint (`couplet.training.pairs`), whose rotary positions extend to 512 without
new weights. A small model uses its context only if, in training, the context predicts the target, so
every sequence is built to make it so (`ContextSampler`):

- **the exemplars** are retrieved for the target exactly as at inference (`couplet.writing.exemplars`): by
  keywords sampled from the target pair (half the time), or by its 上联 (对下联, the other half); the
  pair itself is never among them, and held-out pairs are not in the store;
- **the context before them** is either the real house prefix (`couplet.writing.prompt`), or a *style pack*:
  4-12 corpus couplets of the target's own style bucket (`couplet.writing.lexicon.style_of`), each with loss
  (in-context pretraining). The pack's voice predicts the target's, so the festive house prefix steers
  the voice at inference;
- 10% of sequences are bare (the stage-1 format), so the model still writes without context.

Data weighting: pairs with a taboo character are dropped; festive-leaning pairs are drawn 3× as often
as plain ones and somber ones half as often (`STYLE_WEIGHTS`). Loss covers every couplet body except
the house prefix (constant: learning it would only teach the model to recite it) and the exemplars
(they are the store's 100k pairs, seen again and again; learning them would invite copying).

The learning-rate schedule runs on wall time (`--minutes`): the budget is time on two shared cores,
not a number of steps. A checkpoint with optimizer and sampler state is written every `--save-every`
minutes to `--state`; `--resume` continues from it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from couplet.models.scoring import CONTEXTS, context_nll
from couplet.models.tokenizer import FormatIds, entry_ids
from couplet.training.corpus import Pair, is_heldout, read_pairs, sample_keywords
from couplet.training.pairs import add_config_args, save
from couplet.writing.exemplars import DEFAULT_K, ExemplarStore, load_store
from couplet.writing.folk import FOLK, FOLK_ROUND2, FolkCouplet, load_folk
from couplet.writing.lexicon import style_of
from couplet.writing.prompt import HOUSE_COUPLETS, exemplar_ids, house_ids

STYLE_WEIGHTS = {"festive": 3.0, "plain": 1.0, "somber": 0.5, "taboo": 0.0}
KIND_WEIGHTS = {"lvshi_mid": 0.55, "lvshi_edge": 0.15, "other": 0.30}


@dataclass
class ContextTrainConfig:
    data: str
    init: str = "assets/model"
    out: str = "assets/model"
    state: str = "checkpoints/context/state.pt"
    minutes: float = 100.0
    batch_size: int = 16
    lr: float = 6e-4
    warmup_frac: float = 0.03
    weight_decay: float = 0.1
    p_house: float = 0.35
    p_bare: float = 0.10
    p_duixia: float = 0.5
    eval_every_min: float = 25.0
    save_every_min: float = 5.0
    eval_pairs: int = 300
    seed: int = 4321
    threads: int = 2
    device: str = "cpu"  # "cuda": `scripts/train_gpu.sh`
    bf16: bool = False  # bf16 autocast on CPU is ~25x slower than float32 at 400-token sequences (measured)
    resume: bool = False
    limit_rows: int | None = None
    style_weights: dict[str, float] = field(default_factory=lambda: dict(STYLE_WEIGHTS))
    # the project's own 春联 with 横批 (`couplet.writing.folk`), both rounds; () leaves them out
    folk: tuple[str, ...] = (str(FOLK), str(FOLK_ROUND2))
    p_folk: float = 0.15  # share of targets drawn from them
    p_hengpi: float = 0.9  # share of their entries that end `<sep> 横批` (the rest end at the 下联)

    def __post_init__(self) -> None:
        if self.minutes <= 0:
            raise ValueError(f"minutes must be positive, got {self.minutes}")
        if not 0 <= self.p_house + self.p_bare <= 1:
            raise ValueError("p_house + p_bare must be in [0, 1]")
        if not (0 <= self.p_folk <= 1 and 0 <= self.p_hengpi <= 1):
            raise ValueError("p_folk and p_hengpi must be in [0, 1]")
        # a single path (the field was one string before 2026-12-08) is one file; "" names none
        self.folk = tuple(f for f in ((self.folk,) if isinstance(self.folk, str) else self.folk) if f)
        if self.p_folk and (missing := [f for f in self.folk if not Path(f).is_file()]):
            raise FileNotFoundError(f"--folk: no such file {missing[0]}")


@dataclass
class Sample:
    """One training sequence and the mask of positions that carry loss."""

    ids: list[int]
    loss: list[bool]


class ContextSampler:
    """Builds training sequences: context (house prefix or style pack), exemplars, target."""

    def __init__(self, tok: PreTrainedTokenizerBase, pairs: list[Pair], store: ExemplarStore,
                 cfg: ContextTrainConfig, rng: random.Random):
        self.tok, self.store, self.cfg, self.rng = tok, store, cfg, rng
        self.f = FormatIds.of(tok)
        self.house = house_ids(tok)
        self.by_style: dict[str, list[Pair]] = defaultdict(list)
        groups: dict[tuple[str, str], list[Pair]] = defaultdict(list)
        for p in pairs:
            style = style_of(p.upper + p.lower)
            if cfg.style_weights.get(style, 0) > 0:
                self.by_style[style].append(p)
                groups[(p.kind, style)].append(p)
        self.groups = list(groups.values())
        self.weights = [KIND_WEIGHTS[k] * cfg.style_weights[s] * len(g) ** 0.5 for (k, s), g in groups.items()]
        self.counts = {f"{k}/{s}": len(g) for (k, s), g in groups.items()}
        # the project's own 春联, but never one of the house prefix (the prompt shows those: learning to
        # write one after seeing it would teach copying)
        house = {h.upper for h in HOUSE_COUPLETS}
        self.folk = [c for path in cfg.folk if cfg.p_folk for c in load_folk(path) if c.upper not in house]
        self.counts["folk"] = len(self.folk)

    def target(self) -> Pair:
        return self.rng.choice(self.rng.choices(self.groups, self.weights)[0])

    def _hengpi(self, c: FolkCouplet) -> str:
        return c.hengpi if self.rng.random() < self.cfg.p_hengpi else ""

    def sample(self) -> Sample:
        rng, cfg = self.rng, self.cfg
        folk = rng.choice(self.folk) if self.folk and rng.random() < cfg.p_folk else None
        pair = Pair(folk.upper, folk.lower, "folk") if folk else self.target()
        ids, loss = [self.f.bos], [False]

        def add(tokens: list[int], with_loss: bool) -> None:
            ids.extend(tokens)
            # loss on the body only: what follows <sep> (上联, <mid>, 下联, a 横批, <eos>)
            if with_loss:
                sep = tokens.index(self.f.sep)  # a second <sep> (before a 横批) is given, not learned
                loss.extend([False] * (sep + 1) + [t != self.f.sep for t in tokens[sep + 1 :]])
            else:
                loss.extend([False] * len(tokens))

        r = rng.random()
        if r >= cfg.p_bare:
            if r < cfg.p_bare + cfg.p_house:
                add(self.house, False)
            else:
                bucket = self.by_style[style_of(pair.upper + pair.lower)]
                pack = [entry_ids(self.tok, "", p.upper, p.lower)
                        for p in rng.sample(bucket, min(len(bucket), rng.randint(4, 12) - 3 * bool(folk)))]
                if folk:  # a 春联's pack: corpus couplets of its style and 2-4 other 春联, shuffled
                    others = rng.sample(self.folk, min(len(self.folk) - 1, rng.randint(2, 4)))
                    pack += [entry_ids(self.tok, "", c.upper, c.lower, self._hengpi(c)) for c in others if c != folk]
                    rng.shuffle(pack)
                for entry in pack:
                    add(entry, True)
        duixia = rng.random() < cfg.p_duixia
        keywords = "" if duixia else sample_keywords(pair, rng)
        if r >= cfg.p_bare:
            k = DEFAULT_K if rng.random() < 0.85 else rng.randint(0, DEFAULT_K - 1)
            query = keywords or pair.upper
            exemplars = self.store.retrieve(query, len(pair.upper), k, exclude=(pair.upper, pair.lower))
            add(exemplar_ids(self.tok, exemplars), False)
        add(entry_ids(self.tok, keywords, pair.upper, pair.lower, self._hengpi(folk) if folk else ""), True)
        return Sample(ids, loss)


def batch(samples: list[Sample], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (batch, width) inputs and labels (-100 where no loss)."""
    width = max(len(s.ids) for s in samples)
    inputs = torch.full((len(samples), width), pad, dtype=torch.long)
    labels = torch.full((len(samples), width), -100, dtype=torch.long)
    for row, s in enumerate(samples):
        t = torch.tensor(s.ids)
        inputs[row, : len(t)] = t
        labels[row, : len(t)] = torch.where(torch.tensor(s.loss), t, -100)
    return inputs, labels


def lr_at(progress: float, cfg: ContextTrainConfig) -> float:
    """Linear warm-up over the first `warmup_frac` of the time, then cosine decay to 10% of the peak."""
    if progress < cfg.warmup_frac:
        return cfg.lr * max(progress / cfg.warmup_frac, 0.01)
    p = min(1.0, (progress - cfg.warmup_frac) / (1 - cfg.warmup_frac))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def main(cfg: ContextTrainConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    torch.set_grad_enabled(True)  # a caller (e.g. a test process) may have left autograd off
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    t_read = time.time()
    tok = AutoTokenizer.from_pretrained(cfg.init)
    tok.model_max_length = 512
    model = AutoModelForCausalLM.from_pretrained(cfg.init, dtype=torch.float32)
    model.to(cfg.device)  # type: ignore[arg-type]  # transformers' stub types .to's argument as a model
    model.config.max_position_embeddings = 512
    pairs: list[Pair] = []
    heldout: list[Pair] = []
    for i, p in enumerate(read_pairs(cfg.data)):
        if cfg.limit_rows and i >= cfg.limit_rows:
            break
        (heldout if is_heldout(p) else pairs).append(p)
    store = load_store()
    sampler = ContextSampler(tok, pairs, store, cfg, rng)
    print(f"read {len(pairs)} pairs ({len(heldout)} held out) in {time.time() - t_read:.0f}s; "
          f"groups {sampler.counts}", file=sys.stderr, flush=True)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    state_path = Path(cfg.state)
    step, elapsed, tokens_seen, history = 0, 0.0, 0, []
    if cfg.resume:
        if not state_path.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {state_path}")
        st = torch.load(state_path, weights_only=False, map_location=cfg.device)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed, tokens_seen, history = st["step"], st["elapsed"], st["tokens_seen"], st["history"]
        rng.setstate(st["rng"])
        torch.set_rng_state(st["torch_rng"].cpu())
        print(f"resumed at step {step}, {elapsed / 60:.1f} of {cfg.minutes} min", file=sys.stderr, flush=True)
    eval_set = [(p.upper, p.lower) for p in heldout[: cfg.eval_pairs]]

    def evaluate() -> dict:
        model.eval()
        row = {"step": step, "minutes": round(elapsed / 60, 1)}
        with torch.no_grad():
            for how in CONTEXTS if eval_set else ():
                row[f"nll_{how}"] = round(context_nll(model, tok, eval_set, how), 4)
        model.train()
        history.append(row)
        print(f"eval {json.dumps(row)}", file=sys.stderr, flush=True)
        return row

    def checkpoint() -> None:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "tokens_seen": tokens_seen, "history": history, "rng": rng.getstate(),
                    "torch_rng": torch.get_rng_state()}, tmp)
        tmp.replace(state_path)

    if not history:
        evaluate()
    model.train()
    budget = cfg.minutes * 60
    last_save = last_eval = elapsed
    ema = None
    queue: list[list[Sample]] = []
    while elapsed < budget:
        t0 = time.time()
        if not queue:
            # 4 batches' worth, sorted by length and cut into batches: far less padding (lengths run 15-430)
            pool = sorted((sampler.sample() for _ in range(4 * cfg.batch_size)), key=lambda s: len(s.ids))
            queue = [pool[i : i + cfg.batch_size] for i in range(0, len(pool), cfg.batch_size)]
            rng.shuffle(queue)
        inputs, labels = (t.to(cfg.device) for t in batch(queue.pop(), FormatIds.of(tok).pad))
        for group in opt.param_groups:
            group["lr"] = lr_at(elapsed / budget, cfg)
        with torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = model(input_ids=inputs, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += int((labels != -100).sum())
        ema = loss.item() if ema is None else 0.97 * ema + 0.03 * loss.item()
        elapsed += time.time() - t0
        if step % 20 == 0:
            print(f"step {step} loss {ema:.3f} lr {lr_at(elapsed / budget, cfg):.2e} "
                  f"{elapsed / 60:.1f}/{cfg.minutes:.0f} min, {tokens_seen / elapsed:.0f} loss-tok/s",
                  file=sys.stderr, flush=True)
        if elapsed - last_eval >= cfg.eval_every_min * 60 and elapsed < budget:
            last_eval = elapsed
            evaluate()
            save(model, tok, Path(cfg.out), {"stage": 2, "history": history})  # type: ignore[arg-type]
        if elapsed - last_save >= cfg.save_every_min * 60:
            last_save = elapsed
            checkpoint()
    final = evaluate()
    checkpoint()
    stats = {"stage": 2, "init": cfg.init, "config": asdict(cfg), "steps": step,
             "train_minutes": round(elapsed / 60, 1),
             "tokens_seen": tokens_seen, "groups": sampler.counts, "history": history, "final": final,
             "data_source": "chinese-poetry/chinese-poetry (MIT), Tang and Song poems; the project's own 春联 "
                            "(assets/folk: traditional folk couplets, public domain, and new modern-theme ones)"}
    save(model, tok, Path(cfg.out), stats)  # type: ignore[arg-type]
    print(f"done: {json.dumps(final)} -> {cfg.out}", file=sys.stderr, flush=True)
    return stats


def parse_args(argv: list[str] | None = None) -> ContextTrainConfig:
    p = argparse.ArgumentParser(prog="python -m couplet.training.context", description=__doc__.split("\n")[0])
    defaults = ContextTrainConfig(data="")
    p.add_argument("--data", required=True, help="path to couplets_train.tsv.xz (read, never copied)")
    add_config_args(p, defaults, ("init", "out", "state", "minutes", "batch_size", "lr", "p_house", "p_bare",
                                  "p_duixia", "p_folk", "p_hengpi", "warmup_frac", "device",
                                  "eval_every_min", "save_every_min", "eval_pairs", "seed", "threads", "limit_rows"))
    p.add_argument("--folk", nargs="*", default=list(defaults.folk), metavar="TSV",
                   help="the project's 春联 to train on (default: both rounds of assets/folk); none leaves them out")
    p.add_argument("--resume", action="store_true",
                   help="continue --state; give the run's own options again (--folk included: the state does not "
                        "hold them, and the default is both rounds since 2026-12-08)")
    p.add_argument("--bf16", action="store_true")
    args = vars(p.parse_args(argv))
    return ContextTrainConfig(**args | {"folk": tuple(args["folk"])})


if __name__ == "__main__":
    try:
        main(parse_args())
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
