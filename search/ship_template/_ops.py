"""One ``torch.library`` custom op per shipped kernel, built from the manifest.

Convention (the serving libraries' own): an op takes the kernel's tensors in the spec's
argument order, then its float constants as optional arguments (default: the value the
kernel was verified with), writes its outputs into the tensors given for them (``out`` and
``inout`` arguments, declared as mutated) and returns nothing. The shape symbols of the C
signature are not arguments: they are read off the tensors' sizes.

The fake implementation runs the same checks (all but the data pointers') and returns
nothing, so ``torch.compile`` traces the op without a graph break, and the real one launches
the cubin of the tensors' dtype on torch's current stream (captured by CUDA graphs).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from . import _dispatch, _launch
from ._checks import ArgInfo, DimRule, Signature
from ._errors import LaunchError, LayoutError
from ._runtime import Runtime

MAX_CACHED_LAUNCHES = 4096  # resolved launches kept per op (one per dtype and shape seen)


class LaunchPlans:
    """Which kernel runs, and its grid, block and shared memory, per dtype and shape, from the
    shipped sources' headers: the winner's, or (a dispatch) the one the run's table gives the
    shape (``_dispatch.member_for``)."""

    def __init__(self, kernel: str, builds: Mapping[str, Mapping[str, Any]], package_dir: Path) -> None:
        self.kernel = kernel
        self.specs: dict[tuple[str, int], Any] = {}
        self.params: dict[tuple[str, int], dict[str, int]] = {}
        self.dispatch: dict[str, Mapping[str, Any]] = {}
        for dtype, b in builds.items():
            for i, m in enumerate([b, *b.get("members", [])]):
                self.specs[(dtype, i)] = _launch.parse_launch_header((package_dir / m["source"]).read_text())
                self.params[(dtype, i)] = {k: int(v) for k, v in m["params"].items()}
            if b.get("members"):
                self.dispatch[dtype] = b["dispatch"]
        self._cache: dict[tuple[str, tuple[tuple[str, int], ...]], Any] = {}

    def member(self, dtype: str, symbols: Mapping[str, int]) -> int:
        """The kernel that runs on these shape symbols (0: the winner)."""
        d = self.dispatch.get(dtype)
        return _dispatch.member_for(symbols, d["shapes"], d["table"]) if d else 0

    def resolve(self, dtype: str, symbols: Mapping[str, int]) -> Any:
        """``(member, launch config)`` for this dtype and shape."""
        key = (dtype, tuple(sorted(symbols.items())))
        cfg = self._cache.get(key)
        if cfg is None:
            try:
                member = self.member(dtype, symbols)
                cfg = (member, self.specs[(dtype, member)].resolve(symbols, self.params[(dtype, member)]))
                _launch.check_limits(cfg[1], _launch.DeviceLimits(), f"for {self.kernel} at {dict(symbols)}")
            except _launch.LaunchSpecError as exc:
                raise LaunchError(f"{self.kernel}: {exc}") from None
            if len(self._cache) >= MAX_CACHED_LAUNCHES:
                self._cache.clear()
            self._cache[key] = cfg
        return cfg


def python_signature(sig: Signature, constants: Mapping[str, float]) -> inspect.Signature:
    """The op's Python signature: tensors, then float constants with their verified defaults."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(a.name, kind, annotation=torch.Tensor) for a in sig.tensors]
    params += [inspect.Parameter(a.name, kind, annotation=float, default=float(constants[a.name]))
               for a in sig.floats]
    return inspect.Signature(params, return_annotation=None)


def make_op(namespace: str, kernel: str, entry: Mapping[str, Any], align_bytes: int, runtime: Runtime,
            package_dir: Path) -> Any:
    """Registers ``namespace::kernel`` and returns the custom op (callable like a function)."""
    args = [ArgInfo.from_dict(a) for a in entry["args"]]
    dims = {name: [DimRule.from_dict(r) for r in rules] for name, rules in entry["dims"].items()}
    sig = Signature(kernel, args, dims, sorted(entry["builds"]), align_bytes)
    plans = LaunchPlans(kernel, entry["builds"], package_dir)
    py_sig = python_signature(sig, entry.get("constants", {}))
    kinds = [a.kind for a in sig.args]

    def bound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        b = py_sig.bind(*args, **kwargs)
        b.apply_defaults()
        return ({a.name: b.arguments[a.name] for a in sig.tensors},
                {a.name: b.arguments[a.name] for a in sig.floats})

    def real(*args: Any, **kwargs: Any) -> None:
        tensors, floats = bound(args, kwargs)
        device = next(iter(tensors.values())).device
        if device.type != "cuda":
            raise LayoutError(f"{kernel}: tensors on {device}; the op runs on CUDA devices only")
        dtype, symbols = sig.check(tensors, pointers=True)
        index = device.index if device.index is not None else torch.cuda.current_device()
        member, cfg = plans.resolve(dtype, symbols)
        loaded = runtime.function(kernel, dtype, index, member)
        values = [tensors[a.name].data_ptr() if a.kind == "tensor" else
                  int(symbols[a.name]) if a.kind == "int" else float(floats[a.name]) for a in sig.args]
        stream = torch.cuda.current_stream(index).cuda_stream
        runtime.launch(loaded, kernel, cfg.grid, cfg.block, cfg.smem_bytes, kinds, values, stream)

    def fake(*args: Any, **kwargs: Any) -> None:
        tensors, _ = bound(args, kwargs)
        sig.check(tensors, pointers=False)

    for fn in (real, fake):
        fn.__signature__ = py_sig  # type: ignore[attr-defined]
        fn.__name__ = kernel
        fn.__doc__ = _docstring(sig, entry)
    mutated = [a.name for a in sig.tensors if a.written]
    op = torch.library.custom_op(f"{namespace}::{kernel}", real, mutates_args=mutated)
    torch.library.register_fake(f"{namespace}::{kernel}", fake)
    return op


def _docstring(sig: Signature, entry: Mapping[str, Any]) -> str:
    lines = [entry.get("description", ""), "", "Arguments (outputs are written in place; returns None):"]
    for a in sig.tensors:
        dtype = "the run dtype" if a.dtype == "scalar" else a.dtype
        lines.append(f"    {a.name}: {sig.layout_text(a.name)}, {dtype}, {a.role}")
    for a in sig.floats:
        lines.append(f"    {a.name}: float (verified with {entry.get('constants', {}).get(a.name)})")
    lines.append(f"Shipped dtypes: {', '.join(sig.dtypes)}.")
    return "\n".join(lines)


def register_all(namespace: str, manifest: Mapping[str, Any], runtime: Runtime,
                 package_dir: Path) -> dict[str, Callable[..., None]]:
    """Every op of the manifest, by kernel name."""
    align = int(manifest["align_bytes"])
    return {kernel: make_op(namespace, kernel, entry, align, runtime, package_dir)
            for kernel, entry in sorted(manifest["kernels"].items())}
