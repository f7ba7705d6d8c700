"""The live progress line: round, evaluations, best speedup per kernel, evaluator busy fraction,
and what the search is waiting for.

The best speedup on it is the screening score (the search's own evaluation of each variant, one
run, on the search shapes); the report's headline comes later, from the final evaluation and
the end-of-run loops, so the two may differ.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def busy_fraction(busy_s: float, wall_s: float, n_gpus: int) -> float:
    """Seconds spent evaluating on the evaluator actors over the seconds they could have."""
    if wall_s <= 0 or n_gpus <= 0:
        return 0.0
    return min(1.0, busy_s / (wall_s * n_gpus))


def busy_label(evaluator_kind: str) -> str:
    """What the busy fraction measures: the GPUs for the GPU evaluator; for any other (the
    CPU stand-in) only the evaluator actors, and no GPU is involved."""
    return "gpu busy" if evaluator_kind == "gpu" else "evaluator busy"


def waiting_text(controller: Any) -> str:
    """`` | waiting for 8 agent answers, 2 compiles``: what the loop waits on, so a line that
    does not move for a while says why (agents thinking, NVRTC, evaluators starting)."""
    waiting = getattr(controller, "waiting", None)
    counts = waiting() if callable(waiting) else {}
    if not counts:
        return ""
    return " | waiting for " + ", ".join(f"{n} {kind}{'' if n == 1 else 's'}" for kind, n in counts.items())


class Progress:
    """Writes one status line: rewritten in place on a terminal, plain lines otherwise.

    Args:
        stream: where to write (stderr by default, so stdout keeps the report).
        n_gpus: evaluator actors, for the busy fraction.
        interval_s: least time between two updates that are not forced.
        evaluator_kind: the run's evaluator (``gpu`` or ``standin``), naming the busy fraction.
    """

    def __init__(self, stream: TextIO | None = None, n_gpus: int = 1, interval_s: float = 1.0,
                 evaluator_kind: str = "gpu") -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.n_gpus = n_gpus
        self.busy_label = busy_label(evaluator_kind)
        self.interval_s = interval_s if self.tty else max(interval_s, 10.0)
        self._last = 0.0
        self._width = 0

    def line(self, controller: Any) -> str:
        states = controller.states
        rounds = controller.config.search.rounds
        current = min((st.rounds_done for st in states), default=0)
        best = " ".join(
            f"{st.name}={st.best().score:.3f}x" for st in states if st.baseline_scored is not None
        )
        wall = time.time() - controller.start
        busy = busy_fraction(controller.pool.busy_s, wall, self.n_gpus)
        return (
            f"round {min(current + 1, rounds)}/{rounds} | evaluations {len(controller.cache)} | "
            f"best screened {best or '-'} | {self.busy_label} {busy:.0%} | {wall:.0f}s{waiting_text(controller)}"
        )

    def update(self, controller: Any, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        text = self.line(controller)
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
