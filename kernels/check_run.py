"""The CPU half of ``python -m kernels.check``: a spec's inputs and reference, run for real.

At the smallest search shape, for every run dtype and input case (``random`` and each edge
case), the checks make the inputs on the CPU and run the reference on them, then hold both to
what the argument list says: every tensor argument made with its dtype, contiguous; every
written (``out``/``inout``) argument returned in its tensor's shape and nothing else; the
inputs left as they were; no ``out`` buffer read; and ``bytes_moved`` at least the bytes that
the reference shows a kernel must read and write (see :func:`traffic_floor`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels.spec import SCALAR, KernelSpec, Shape, shape_key, shape_label


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def smallest_shape(spec: KernelSpec, sizes: Mapping[tuple[tuple[str, int], ...], int | str] | None = None) -> dict[str, int]:
    """The search shape with the fewest tensor elements, so the CPU runs stay quick: by the
    sizes already found on the meta device (``sizes``, keyed by
    :func:`kernels.spec.shape_key`), else sized there now, else by the product of its sizes
    where the meta device cannot size it."""

    def size(shape: dict[str, int]) -> int:
        known = (sizes or {}).get(shape_key(shape))
        if isinstance(known, int):
            return known
        try:
            return sum(spec.tensor_elements(shape).values())
        except Exception:  # make_inputs fails on meta: reported by the static checks
            product = 1
            for v in shape.values():
                product *= max(1, int(v))
            return product

    smallest: dict[str, int] = min(spec.search_shapes, key=size)
    return dict(smallest)


def check_made(spec: KernelSpec, made: Any, dtype: str) -> list[str]:
    """What ``make_inputs`` returned against the argument list: one tensor per tensor argument,
    of the argument's dtype, contiguous."""
    import torch

    if not isinstance(made, Mapping):
        return [f"make_inputs returns {type(made).__name__}, not a dict of tensors"]
    problems = []
    tensors = {a.name: a for a in spec.args if a.kind == "tensor"}
    missing = [n for n in tensors if n not in made]
    if missing:
        problems.append(f"make_inputs returns no tensor for {', '.join(missing)}")
    extra = [n for n in made if n not in tensors]
    if extra:
        problems.append(f"make_inputs returns {', '.join(map(str, extra))}, which the argument list has no tensor for")
    for name, arg in tensors.items():
        t = made.get(name)
        if name in missing:
            continue
        if not isinstance(t, torch.Tensor):
            problems.append(f"make_inputs returns {type(t).__name__} for {name}, not a tensor")
            continue
        want = arg.tensor_dtype(dtype)
        if t.dtype != getattr(torch, want):
            what = "scalar (the run's dtype)" if arg.dtype == SCALAR else want
            problems.append(f"make_inputs makes {name} as {str(t.dtype).removeprefix('torch.')}; its argument says {what}")
        if not t.is_contiguous():
            problems.append(f"make_inputs makes {name} non-contiguous (kernels index it as a flat array)")
    return problems


def check_returned(spec: KernelSpec, expected: Any, inputs: Mapping[str, Any]) -> list[str]:
    """What the reference returned against the roles: every out/inout argument, nothing else,
    each in the shape of its tensor."""
    import torch

    if not isinstance(expected, Mapping):
        return [f"reference returns {type(expected).__name__}, not a dict of the written arguments' values"]
    problems = []
    written = [a.name for a in spec.written_args]
    roles = {a.name: a.role for a in spec.args}
    for name in written:
        if name not in expected:
            problems.append(f"reference returns no value for {name} (role {roles[name]}): every out/inout "
                            "argument needs its expected value")
    for name in expected:
        if name in written:
            continue
        if name in roles:
            problems.append(f"reference returns {name}, whose role is {roles[name]!r}: a kernel that writes it "
                            "needs role 'out' or 'inout', else the reference must not return it")
        else:
            problems.append(f"reference returns {name!s}, which is not an argument")
    for name in written:
        got = expected.get(name)
        if name not in expected:
            continue
        if not isinstance(got, torch.Tensor):
            problems.append(f"reference returns {type(got).__name__} for {name}, not a tensor")
        elif tuple(got.shape) != tuple(inputs[name].shape):
            problems.append(f"reference returns {name} of shape {list(got.shape)}, its tensor has "
                            f"shape {list(inputs[name].shape)}")
    return problems


def _changed(before: Any, after: Any) -> bool:
    import torch

    return not torch.equal(before.contiguous().view(torch.uint8), after.contiguous().view(torch.uint8))


def check_untouched(given: Mapping[str, Any], pristine: Mapping[str, Any]) -> list[str]:
    """The reference must compute from its inputs without changing them: the compiled peer
    and the evaluator hand it tensors they use again."""
    return [f"reference changes its argument {name} in place (compute from a copy: the evaluator reuses its inputs)"
            for name in pristine if name in given and _changed(pristine[name], given[name])]


def check_out_not_read(spec: KernelSpec, shape: Shape, inputs: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """An ``out`` buffer holds garbage before a launch (the evaluator poisons it), so the
    reference must not depend on it: run again with every out buffer full of NaN."""
    import torch

    outs = [a.name for a in spec.args if a.kind == "tensor" and a.role == "out"]
    if not outs:
        return []
    poisoned = {k: v.clone() for k, v in inputs.items()}
    for name in outs:
        poisoned[name].fill_(float("nan") if poisoned[name].is_floating_point() else -1)
    again = spec.reference(poisoned, shape, spec.constants)
    return [f"reference reads {name}, whose role is 'out' (its value before the launch is garbage): "
            "make it 'inout'" for name in outs
            if isinstance(again.get(name), torch.Tensor) and isinstance(expected.get(name), torch.Tensor)
            and not torch.equal(torch.nan_to_num(again[name].float(), 1.0), torch.nan_to_num(expected[name].float(), 1.0))]


def traffic_floor(spec: KernelSpec, shape: Shape, inputs: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, int]:
    """Bytes a kernel must move at least, per tensor, from what the reference shows.

    Written: an ``out`` tensor whole (a launch must fill it), an ``inout`` tensor where the
    reference changes it. Read: the elements of floating-point ``in``/``inout`` tensors that
    the written results depend on, found as the nonzero entries of the gradient of a random
    combination of the results (a nonzero derivative means the element was read). Integer
    inputs (indices, positions) are not counted, nor is anything when the reference cannot be
    differentiated: the floor stays a floor, never more than a correct kernel must move.
    """
    import torch

    floor: dict[str, int] = {}
    for a in spec.written_args:
        t, want = inputs[a.name], expected.get(a.name)
        if a.role == "out":
            elements = t.numel()
        elif isinstance(want, torch.Tensor) and want.shape == t.shape:
            elements = int((want.float() != t.float()).sum())
        else:
            elements = 0
        floor[f"{a.name} written"] = elements * t.element_size()
    for name, elements in _read_elements(spec, shape, inputs).items():
        floor[f"{name} read"] = elements * inputs[name].element_size()
    return floor


def _weights(result: Any, before: Any, gen: Any) -> Any:
    """Random weights for one result, zero where an ``inout`` result keeps its value: the
    reference passes those elements through, a kernel leaves them in place unread."""
    import torch

    w = torch.randn(result.shape, generator=gen)
    if isinstance(before, torch.Tensor) and before.shape == result.shape:
        w = torch.where(result.detach().float() == before.float(), 0.0, w)
    return w


def _read_elements(spec: KernelSpec, shape: Shape, inputs: Mapping[str, Any]) -> dict[str, int]:
    import torch

    read = [a.name for a in spec.read_args if inputs[a.name].is_floating_point()
            and inputs[a.name].dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]
    if not read:
        return {}
    leaves = {k: (v.detach().clone().requires_grad_(True) if k in read else v.clone()) for k, v in inputs.items()}
    try:
        with torch.enable_grad():
            results = spec.reference(leaves, shape, spec.constants)
            gen = torch.Generator().manual_seed(1)
            # Only an inout result is compared with its value before: an out buffer holds
            # whatever memory it was given, which may equal the result anywhere.
            inout = {a.name for a in spec.written_args if a.role == "inout"}
            total = sum((v.float() * _weights(v, inputs.get(k) if k in inout else None, gen)).sum()
                        for k, v in results.items() if isinstance(v, torch.Tensor) and v.requires_grad)
            if not isinstance(total, torch.Tensor):
                return {}
            grads = torch.autograd.grad(total, [leaves[n] for n in read], allow_unused=True)
    except Exception:  # a reference autograd cannot follow: no read floor
        return {}
    return {n: int((g != 0).sum()) for n, g in zip(read, grads, strict=True) if g is not None}


def run_case(spec: KernelSpec, shape: Shape, dtype: str, case: str) -> list[str]:
    """Every check of one input case at one dtype; problems without the dtype or case in
    them are the spec's whatever the run, so the caller can merge repeats."""
    import torch

    where = f"(case {case}, {dtype}, shape {shape_label(shape)})"
    try:
        inputs = spec.make_inputs(shape, getattr(torch, dtype), torch.Generator().manual_seed(0), case,
                                  torch.device("cpu"))
    except Exception as exc:
        return [f"make_inputs fails {where}: {describe_error(exc)}"]
    problems = check_made(spec, inputs, dtype)
    if problems:
        return problems
    pristine = {k: v.clone() for k, v in inputs.items()}
    given = {k: v.clone() for k, v in inputs.items()}
    try:
        expected = spec.reference(given, shape, spec.constants)
    except Exception as exc:
        return [f"reference fails {where}: {describe_error(exc)}"]
    problems = check_returned(spec, expected, inputs) + check_untouched(given, pristine)
    if problems or case != "random":
        return problems
    try:
        problems += check_out_not_read(spec, shape, pristine, expected)
    except Exception as exc:
        problems.append(f"reference fails on out buffers full of NaN {where}: {describe_error(exc)}")
    return problems + check_bytes_moved(spec, shape, dtype, pristine, expected)


def check_bytes_moved(spec: KernelSpec, shape: Shape, dtype: str, inputs: Mapping[str, Any],
                      expected: Mapping[str, Any]) -> list[str]:
    """``bytes_moved`` at the shape against :func:`traffic_floor`."""
    floor = traffic_floor(spec, shape, inputs, expected)
    need = sum(floor.values())
    try:
        claimed = int(spec.bytes_moved(shape, dtype))
    except Exception:  # said by the static checks, which call it at every shape
        return []
    if claimed >= need:
        return []
    parts = ", ".join(f"{k} {v}" for k, v in floor.items() if v)
    return [f"bytes_moved gives {claimed} bytes at shape {shape_label(shape)} ({dtype}), less than the {need} "
            f"a kernel must move ({parts}): bandwidth figures and the faster-than-copy guard would be off"]
