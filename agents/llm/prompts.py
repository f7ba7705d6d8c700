"""Rendering the prompt templates of ``agents/prompts`` from an :class:`AgentContext`.

The templates hold the words; this module turns verdicts, profiles, history and elites into
the short text blocks the templates place. The history is given in full while it fits the
budget; beyond it, the oldest attempts are folded into one line per outcome so that the
planner still sees what failed and how often.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from agents.base import AgentContext, Attempt
from kernels.spec import shape_label
from kernels.verdict import Evaluation

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
SCALAR_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}
_MESSAGE_CHARS = 1500
_ELITE_SOURCE_CHARS = 6000


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(PROMPTS_DIR)),
        undefined=jinja2.StrictUndefined,  # a missing variable is a bug, not an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,
    )


def render(template: str, **values: Any) -> str:
    """Renders ``agents/prompts/<template>.j2``."""
    return _env().get_template(f"{template}.j2").render(**values).strip()


def _speedup(ev: Evaluation | None) -> str:
    sp = ev.speedup if ev is not None else None
    return f"{sp:.3f}x" if sp is not None else "-"


def verdict_text(ev: Evaluation | None) -> str:
    """Status, speedup and the evaluator's message (trimmed) on one or a few lines."""
    if ev is None:
        return "not evaluated yet"
    text = ev.status.value
    if ev.status.is_ok:
        text += f", geometric-mean speedup {_speedup(ev)} over the baseline"
    if ev.message:
        msg = ev.message.strip()
        text += ": " + (msg if len(msg) <= _MESSAGE_CHARS else msg[:_MESSAGE_CHARS] + " ...")
    return text


def profile_text(ev: Evaluation | None) -> str:
    """Per-shape times and bandwidth fractions, then registers, memory and tuned params."""
    if ev is None or not ev.shapes:
        return ""
    lines = []
    for s in ev.shapes:
        lines.append(
            f"- {shape_label(s.shape)}: {s.candidate_ms * 1e3:.1f} us vs baseline {s.baseline_ms * 1e3:.1f} us, "
            f"speedup {s.speedup:.2f}x, bw {s.copy_bw_fraction:.0%}"
        )
    facts = []
    if ev.registers is not None:
        facts.append(f"{ev.registers} registers/thread")
    if ev.smem_bytes is not None:
        facts.append(f"{ev.smem_bytes} B shared memory")
    if ev.local_bytes:
        facts.append(f"{ev.local_bytes} B local memory (spills)")
    if ev.params:
        facts.append("tuned " + ", ".join(f"{k}={v}" for k, v in sorted(ev.params.items())))
    if facts:
        lines.append("- " + "; ".join(facts))
    return "\n".join(lines)


def _attempt_line(a: Attempt) -> str:
    v, ev = a.variant, a.evaluation
    status = ev.status.value if ev is not None else "PENDING"
    first = (ev.message.strip().splitlines() or [""])[0][:200] if ev is not None and ev.message else ""
    line = f"- round {v.round}, {v.id} ({v.note or 'no note'}): {status}"
    if ev is not None and ev.status.is_ok:
        line += f" {_speedup(ev)}"
    return line + (f" - {first}" if first else "")


def history_text(history: Sequence[Attempt], budget_chars: int) -> str:
    """The lineage's attempts, all of them, folded into counts when over budget."""
    if not history:
        return "(none yet: this is the first attempt)"
    lines = [_attempt_line(a) for a in history]
    if sum(len(x) + 1 for x in lines) <= budget_chars:
        return "\n".join(lines)
    keep: list[str] = []
    used = 0
    for line in reversed(lines):  # the newest attempts stay verbatim
        if used + len(line) + 1 > budget_chars * 3 // 4:
            break
        keep.append(line)
        used += len(line) + 1
    folded = history[: len(history) - len(keep)]
    return _fold(folded) + "\n" + "\n".join(reversed(keep))


def _fold(attempts: Sequence[Attempt]) -> str:
    counts: Counter[str] = Counter()
    notes: dict[str, Counter[str]] = {}
    best: Attempt | None = None
    for a in attempts:
        status = a.evaluation.status.value if a.evaluation is not None else "PENDING"
        counts[status] += 1
        notes.setdefault(status, Counter())[a.variant.note or "no note"] += 1
        sp = a.evaluation.speedup if a.evaluation is not None else None
        if sp is not None and (best is None or sp > (best.evaluation.speedup or 0.0)):  # type: ignore[union-attr]
            best = a
    parts = [f"(earlier {len(attempts)} attempts, summarised)"]
    for status, n in counts.most_common():
        common = ", ".join(f"{k} x{c}" for k, c in notes[status].most_common(5))
        parts.append(f"- {status}: {n} ({common})")
    if best is not None:
        parts.append(f"- best of them: {best.variant.id} ({best.variant.note}) {_speedup(best.evaluation)}")
    return "\n".join(parts)


def elites_text(elites: Sequence[Attempt], parent_id: str) -> str:
    """One line per elite, plus the best elite's source when it is not the current kernel."""
    if not elites:
        return "(none yet)"
    lines = []
    for a in elites:
        ev = a.evaluation
        per_shape = ", ".join(f"{shape_label(s.shape)} {s.speedup:.2f}x" for s in (ev.shapes if ev else ()))
        lines.append(f"- {a.variant.id} by {a.variant.author or '?'} ({a.variant.note or 'no note'}): "
                     f"{_speedup(ev)}" + (f" [{per_shape}]" if per_shape else ""))
    top = elites[0].variant
    if top.id != parent_id:
        src = top.source if len(top.source) <= _ELITE_SOURCE_CHARS else top.source[:_ELITE_SOURCE_CHARS] + "\n// ..."
        lines.append(f"Best elite's source ({top.id}):\n```cuda\n{src.strip()}\n```")
    return "\n".join(lines)


def context_values(ctx: AgentContext, history_chars: int) -> dict[str, Any]:
    """The template variables shared by the planner, coder and single-agent prompts."""
    return {
        "kernel": ctx.kernel,
        "description": ctx.description,
        "signature": ctx.signature,
        "dtype": ctx.dtype,
        "scalar_type": SCALAR_TYPES.get(ctx.dtype, ctx.dtype),
        "symbols": list(ctx.shapes[0]) if ctx.shapes else [],
        "shapes": ", ".join(shape_label(s) for s in ctx.shapes),
        "gpu": ctx.gpu,
        "parent_id": ctx.parent.id,
        "source": ctx.parent.source.strip(),
        "verdict": verdict_text(ctx.parent_eval),
        "profile": profile_text(ctx.parent_eval),
        "history": history_text(ctx.history, history_chars),
        "elites": elites_text(ctx.elites, ctx.parent.id),
    }
