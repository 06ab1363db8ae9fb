"""What decoding streams back: a row's `Progress` after each step, and, for several streams advanced together (the
page's modes, in-process or through the engine), a `Round` snapshot after each round, made by `lockstep`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from couplet.events import CoupletResult, StepRecord


@dataclass
class Progress:
    """A mode's state after one step: the text so far and the step's record (each step's exactly once)."""

    mode: str
    upper: str
    lower: str
    record: StepRecord
    result: CoupletResult | None = None  # set on the last step
    logprob: float | None = None  # teacher-forced runs only: log p(followed character)
    # teacher-forced runs, at a free choice (not a keyword): the character this cache would have picked
    # greedily given the followed history, and its margin over the runner-up (nats; `evaluate`'s agreement)
    decision: tuple[str, float] | None = None


@dataclass
class Round:
    """What `stream_modes` yields after every round: each mode's latest Progress, every record so far per
    mode (each step once), and the results of the modes that have finished."""

    latest: dict[str, Progress]
    records: dict[str, list[StepRecord]]
    results: dict[str, CoupletResult]

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.latest)


def lockstep(streams: dict[str, Iterator[Progress]]) -> Iterator[Round]:
    """Take one Progress from every stream per round; yield a Round (a snapshot: a consumer may keep them)
    after every round in which a stream was still running. Used for local decoding and for the engine."""
    live = dict(streams)
    state = Round({}, {m: [] for m in streams}, {})
    while live:
        for m in list(live):
            p = next(live[m], None)
            if p is None:
                del live[m]
                continue
            state.latest[m] = p
            state.records[m].append(p.record)
            if p.result is not None:
                state.results[m] = p.result
        if live:
            yield Round(dict(state.latest), {m: list(r) for m, r in state.records.items()}, dict(state.results))
