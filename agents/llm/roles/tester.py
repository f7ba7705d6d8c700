"""The tester role: extra search shapes proposed from the kernel's description and spec.

Every proposed shape is checked against the spec before it is used: exactly the spec's
shape symbols, positive integers, within size limits derived from the spec's own shapes,
the alignment all of the spec's shapes share (up to 8), and never a held-out shape (those
must stay unseen by the search) nor a repeat of a search shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents.llm.client import ChatClient
from agents.llm.config import RoleConfig
from agents.llm.parse import parse_shapes
from agents.llm.prompts import render
from kernels.spec import KernelSpec, shape_label

MAX_SHAPES = 4
_SIZE_FACTOR = 4  # a proposed size may exceed the spec's largest by this factor
_ELEMENTS_FACTOR = 2  # and the product of sizes the spec's largest product by this one


@dataclass(frozen=True)
class ShapeLimits:
    """Bounds a proposed shape must respect, derived from the spec's shapes."""

    max_value: dict[str, int]
    multiple: dict[str, int]
    max_elements: int

    @classmethod
    def of(cls, spec: KernelSpec) -> ShapeLimits:
        shapes = (*spec.search_shapes, *spec.heldout_shapes)
        max_value, multiple = {}, {}
        for sym in spec.shape_symbols:
            values = [int(s[sym]) for s in shapes]
            max_value[sym] = max(values) * _SIZE_FACTOR
            g = math.gcd(*values)
            multiple[sym] = next(m for m in (8, 4, 2, 1) if g % m == 0)
        biggest = max(math.prod(int(v) for v in s.values()) for s in shapes)
        return cls(max_value, multiple, biggest * _ELEMENTS_FACTOR)


def _key(shape: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((k, int(v)) for k, v in shape.items()))


def check_shape(spec: KernelSpec, shape: Mapping[str, Any], limits: ShapeLimits) -> str:
    """Why ``shape`` cannot be a search shape, or '' when it can."""
    symbols = set(spec.shape_symbols)
    if set(shape) != symbols:
        return f"must give exactly {sorted(symbols)}, got {sorted(shape)}"
    for sym, value in shape.items():
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{sym}={value!r} is not an integer"
        if value <= 0:
            return f"{sym}={value} is not positive"
        if value > limits.max_value[sym]:
            return f"{sym}={value} exceeds {limits.max_value[sym]}"
        if value % limits.multiple[sym]:
            return f"{sym}={value} is not a multiple of {limits.multiple[sym]}"
    if math.prod(shape.values()) > limits.max_elements:
        return f"{shape_label(shape)} exceeds {limits.max_elements} elements"
    if _key(shape) in {_key(s) for s in spec.heldout_shapes}:
        return f"{shape_label(shape)} is a held-out shape"
    if _key(shape) in {_key(s) for s in spec.search_shapes}:
        return f"{shape_label(shape)} is already a search shape"
    return ""


def propose_shapes(
    client: ChatClient, role: RoleConfig, spec: KernelSpec, n: int = MAX_SHAPES
) -> tuple[list[dict[str, int]], dict[str, Any], list[str]]:
    """Asks for up to ``n`` extra search shapes and keeps the valid ones.

    Returns:
        (accepted shapes in symbol order, the call record, reasons for the rejected ones).
    """
    limits = ShapeLimits.of(spec)
    values = {
        "kernel": spec.name,
        "description": spec.description,
        "signature": ", ".join(f"{t}{'*' if p else ''} {a.name}" for a, (t, p) in zip(spec.args, spec.c_signature(), strict=True)),
        "symbols": list(spec.shape_symbols),
        "shapes": ", ".join(shape_label(s) for s in spec.search_shapes),
        "edge_cases": list(spec.edge_cases),
        "constraints": {s: {"max": limits.max_value[s], "multiple": limits.multiple[s]} for s in spec.shape_symbols},
        "max_elements": limits.max_elements,
        "n": n,
    }
    messages = [
        {"role": "system", "content": render("tester_system", **values)},
        {"role": "user", "content": render("tester_user", **values)},
    ]
    record = client.chat("tester", role, messages)
    accepted: list[dict[str, int]] = []
    rejected: list[str] = []
    for shape in parse_shapes(record["reply"]) if not record["error"] else []:
        reason = check_shape(spec, shape, limits)
        if not reason and _key(shape) in {_key(s) for s in accepted}:
            reason = f"{shape_label(shape)} repeats an accepted shape"
        if reason:
            rejected.append(reason)
        elif len(accepted) < n:
            accepted.append({sym: int(shape[sym]) for sym in spec.shape_symbols})
    return accepted, record, rejected
