"""Kernel specs: what a kernel computes, its argument list, shapes, inputs and tolerances.

Each kernel of the library is a folder ``kernels/NAME/`` with ``spec.py`` (defining
``SPEC = KernelSpec(...)``) and ``baseline.cu`` (the starting kernel, in the variant file
format of :mod:`kernels.launch`). Reference functions and input generators are torch code;
they run in the evaluator's worker process on the GPU (or on the CPU in tests).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kernels.folders import KernelRef, KernelSpecError
from kernels.launch import LaunchSpec, LaunchSpecError, check_names, parse_launch_header
from kernels.peer import Peer

LIBRARY_DIR = Path(__file__).resolve().parent
SCALAR = "scalar"  # a tensor whose element type is the run's dtype (the macro scalar_t)

Shape = Mapping[str, int]
# A shape with a tensor of at least this many elements needs 64-bit offsets (a signed 32-bit
# index wraps past it); see KernelSpec.is_huge.
HUGE_ELEMENTS = 2**31
Tensors = dict[str, Any]  # name -> torch.Tensor (kept Any so this module imports without torch)

# Output-dtype tolerances (rtol, atol) for |got - expected| <= atol + rtol * |expected|.
# fp16/bf16: about four units in the last place, enough for a different (correct)
# summation order and fast intrinsics, far too tight for a precision downgrade.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (4e-3, 1e-4),
    "bfloat16": (3.2e-2, 1e-3),
    "float32": (2e-5, 2e-5),
}
_C_TYPES = {
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float32": "float",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "int8": "signed char",
    "float8_e4m3fn": "__nv_fp8_e4m3",
    "bool": "bool",  # one byte, 0 or 1, as torch stores it: masks
}


@dataclass(frozen=True)
class Arg:
    """One argument of the kernel's C signature, in order.

    Attributes:
        name: the C parameter name, also the key in input dicts and shapes.
        kind: ``tensor`` (a device pointer), ``int`` (a shape symbol) or ``float`` (a constant
            from ``KernelSpec.constants``).
        dtype: for tensors, ``scalar`` (the run's dtype) or a torch dtype name.
        role: for tensors: ``in`` (must be unchanged), ``out`` (fully written), ``inout``.
        min_value: for ints: the smallest value a shape may give (1 for sizes, 0 for flags).
        multiple_of: for ints: every value a shape gives (fixed or drawn) is a multiple of
            this, and a variant may rely on nothing more: the alignment the kernel's callers
            promise (8 elements for 16-byte rows of fp16/bf16). Held-out shapes sit at exactly
            this alignment (``multiple_of`` times an odd number), so a kernel that assumes more
            meets its tail.
        perturb: for tensors read by the kernel: whether the timing loops may overwrite a few
            of its elements before each launch (with values taken from elsewhere in it), so that
            no launch sees an earlier launch's inputs. False for inputs whose values carry a
            contract the result depends on discontinuously, such as a sampling draw made to sit
            inside one id's step of a distribution (a copied element would put it near a step's
            edge, where two correct kernels summing in different orders pick different ids).
            The loops still alternate between two input sets, and the other inputs still change.
    """

    name: str
    kind: Literal["tensor", "int", "float"]
    dtype: str = SCALAR
    role: Literal["in", "out", "inout"] = "in"
    min_value: int = 1
    multiple_of: int = 1
    perturb: bool = True

    def __post_init__(self) -> None:
        if self.multiple_of < 1:
            raise KernelSpecError(f"argument {self.name}: multiple_of must be at least 1")
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", self.name):
            raise KernelSpecError(f"argument name {self.name!r} is not a C identifier")
        if self.kind not in ("tensor", "int", "float"):
            raise KernelSpecError(f"argument {self.name}: kind must be tensor, int or float")
        if self.role not in ("in", "out", "inout"):
            raise KernelSpecError(f"argument {self.name}: role must be in, out or inout")
        if not self.perturb and (self.kind != "tensor" or self.role == "out"):
            raise KernelSpecError(f"argument {self.name}: perturb=False is for tensors the kernel reads")
        if self.kind == "tensor" and self.dtype != SCALAR and self.dtype not in _C_TYPES:
            raise KernelSpecError(f"argument {self.name}: unknown dtype {self.dtype!r}")

    @property
    def written(self) -> bool:
        return self.kind == "tensor" and self.role in ("out", "inout")

    def tensor_dtype(self, run_dtype: str) -> str:
        return run_dtype if self.dtype == SCALAR else self.dtype


@dataclass(frozen=True)
class KernelSpec:
    """Everything the evaluator and the agents need to know about one kernel.

    Attributes:
        name: kernel name; also the ``extern "C" __global__`` entry symbol of every variant.
        description: plain words for prompts and reports.
        args: the C argument list every variant must keep.
        dtypes: run dtypes (``float16``, ``bfloat16``, ``float32``) the kernel supports.
        search_shapes: shapes the search optimises on (dicts over the int arguments).
        heldout_shapes: shapes the search never sees, used to re-validate winners.
        make_inputs: ``(shape, dtype, generator, case, device) -> {tensor arg: tensor}``;
            output buffers included (the evaluator poisons them before each launch).
        reference: ``(inputs, shape, constants) -> {written arg: fp32 tensor}``, computed
            from the inputs as they were before the launch.
        bytes_moved: ``(shape, dtype) -> int``, the minimum DRAM traffic of one launch.
        flops: ``(shape) -> int``.
        edge_cases: names of extra input cases ``make_inputs`` understands besides ``random``.
        constants: values of the ``float`` arguments.
        tolerances: per output dtype (rtol, atol); defaults to :data:`DEFAULT_TOLERANCES`.
        compare: optional ``(name, got, expected) -> str | None`` for outputs that are not
            compared elementwise (sets, permutations); returns a mismatch message or None.
        peers: production implementations to time beside ours, ``(inputs, shape, constants)``
            writing into the output tensors, or :class:`kernels.peer.Peer` objects (results
            returned, operands staged outside the timed window); imported lazily, may raise
            ImportError.
        compiled: the torch program ``torch.compile`` is timed on, in the peers' signature;
            by default the fp32 reference with its results rounded into the outputs. Set it
            where that is not what a serving engine would compile: a scatter into a cache
            whose reference returns a whole fp32 copy of the cache would time the copy.
        heldout_draw: ``(random.Random) -> shapes``: held-out shapes drawn per run from
            ranges (see :meth:`draw_heldout`); None draws none.
        directory: the kernel's folder (set by the loader).
    """

    name: str
    description: str
    args: tuple[Arg, ...]
    search_shapes: tuple[dict[str, int], ...]
    heldout_shapes: tuple[dict[str, int], ...]
    make_inputs: Callable[..., Tensors]
    reference: Callable[..., Tensors]
    bytes_moved: Callable[[Shape, str], int]
    flops: Callable[[Shape], int]
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    edge_cases: tuple[str, ...] = ()
    constants: Mapping[str, float] = field(default_factory=dict)
    tolerances: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    compare: Callable[[str, Any, Any], str | None] | None = None
    peers: Mapping[str, Callable[..., None] | Peer] = field(default_factory=dict)
    compiled: Callable[..., None] | None = None
    heldout_draw: Callable[[Any], tuple[dict[str, int], ...]] | None = None
    directory: Path | None = None

    def __post_init__(self) -> None:
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise KernelSpecError(f"{self.name}: argument names repeat: {names}")
        if not any(a.written for a in self.args):
            raise KernelSpecError(f"{self.name}: no argument is written (role out or inout)")
        if not self.dtypes:
            raise KernelSpecError(f"{self.name}: no run dtypes")
        for d in self.dtypes:
            if d not in ("float16", "bfloat16", "float32"):
                raise KernelSpecError(f"{self.name}: unsupported run dtype {d!r}")
        for a in self.args:
            if a.kind == "float" and a.name not in self.constants:
                raise KernelSpecError(f"{self.name}: float argument {a.name} needs a value in constants")
        if not self.search_shapes:
            raise KernelSpecError(f"{self.name}: no search shapes")
        if not self.heldout_shapes:
            raise KernelSpecError(f"{self.name}: no held-out shapes")
        for shape in (*self.search_shapes, *self.heldout_shapes):
            self.check_shape(shape)
        overlap = {shape_key(s) for s in self.search_shapes} & {shape_key(s) for s in self.heldout_shapes}
        if overlap:
            raise KernelSpecError(f"{self.name}: held-out shapes repeat search shapes: {sorted(overlap)}")

    def check_shape(self, shape: Shape) -> None:
        """Checks that a shape gives every int argument a value within its promise.

        Raises:
            KernelSpecError: a symbol is missing or extra, a value is below its ``min_value``
                or not a multiple of its ``multiple_of``.
        """
        symbols = set(self.shape_symbols)
        if set(shape) != symbols:
            raise KernelSpecError(f"{self.name}: shape {dict(shape)} must give exactly {sorted(symbols)}")
        ints = {a.name: a for a in self.args if a.kind == "int"}
        low = [k for k, v in shape.items() if int(v) < ints[k].min_value]
        if low:
            raise KernelSpecError(
                f"{self.name}: shape {dict(shape)} has a non-positive size or negative flag: "
                f"{low[0]}={shape[low[0]]}, below its min_value {ints[low[0]].min_value}"
            )
        off = [k for k, v in shape.items() if int(v) % ints[k].multiple_of]
        if off:
            raise KernelSpecError(
                f"{self.name}: shape {dict(shape)} breaks the promised alignment: {off[0]}={shape[off[0]]} "
                f"is not a multiple of {ints[off[0]].multiple_of}"
            )

    @property
    def alignment(self) -> dict[str, int]:
        """Per int argument, the multiple its values always have (``Arg.multiple_of``)."""
        return {a.name: a.multiple_of for a in self.args if a.kind == "int"}

    def tensor_elements(self, shape: Shape) -> dict[str, int]:
        """How many elements each tensor argument holds at ``shape``, found by making the
        inputs on torch's ``meta`` device: nothing is allocated, so this is safe for shapes
        whose tensors would not fit in host memory."""
        import torch

        made = self.make_inputs(shape, torch.float16, torch.Generator(), "random", torch.device("meta"))
        return {name: int(t.numel()) for name, t in made.items()}

    def largest_tensor_elements(self, shape: Shape) -> int:
        """Elements of the shape's largest tensor (see :meth:`tensor_elements`)."""
        return max(self.tensor_elements(shape).values())

    def is_huge(self, shape: Shape) -> bool:
        """True when some tensor holds at least :data:`HUGE_ELEMENTS` (2^31) elements: a shape
        that checks 64-bit indexing, never materialised on the CPU, and skipped by the
        sanitizer (its instrumented launches would take minutes)."""
        return self.largest_tensor_elements(shape) >= HUGE_ELEMENTS

    @property
    def shape_symbols(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.kind == "int")

    @property
    def written_args(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.written)

    @property
    def read_args(self) -> tuple[Arg, ...]:
        """The tensors a launch reads (``in`` and ``inout``): what a timing loop restores."""
        return tuple(a for a in self.args if a.kind == "tensor" and a.role in ("in", "inout"))

    def shapes(self, which: str) -> tuple[dict[str, int], ...]:
        if which == "search":
            return self.search_shapes
        if which == "heldout":
            return self.heldout_shapes
        raise KernelSpecError(f"shape set must be 'search' or 'heldout', got {which!r}")

    def draw_heldout(self, seed: int) -> tuple[dict[str, int], ...]:
        """Held-out shapes drawn for one run from the spec's ranges (``heldout_draw``, given a
        ``random.Random(seed)``), on top of the fixed ``heldout_shapes``: no fixed list can be
        tuned to. The same seed gives the same shapes; none repeats a search shape."""
        if self.heldout_draw is None:
            return ()
        import random

        seen = {shape_key(s) for s in self.search_shapes}
        out = []
        for shape in self.heldout_draw(random.Random(seed)):
            try:
                self.check_shape(shape)
            except KernelSpecError as exc:
                raise KernelSpecError(f"{self.name}: heldout_draw gave a shape outside the spec: {exc}") from None
            if shape_key(shape) not in seen:
                seen.add(shape_key(shape))
                out.append(dict(shape))
        return tuple(out)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return dict(DEFAULT_TOLERANCES, **self.tolerances).get(dtype, DEFAULT_TOLERANCES["float32"])

    @property
    def baseline_path(self) -> Path:
        if self.directory is None:
            raise KernelSpecError(f"{self.name}: spec has no directory; load it with load_kernel")
        return self.directory / "baseline.cu"

    def baseline_source(self) -> str:
        return self.baseline_path.read_text()

    def c_signature(self) -> list[tuple[str, bool]]:
        """Per argument: (C base type, is pointer), in order, for ``scalar_t`` spelled out."""
        out = []
        for a in self.args:
            if a.kind == "tensor":
                out.append(("scalar_t" if a.dtype == SCALAR else _C_TYPES[a.dtype], True))
            else:
                out.append(("int" if a.kind == "int" else "float", False))
        return out

    def check_launch(self, launch: LaunchSpec) -> None:
        check_names(launch, set(self.shape_symbols))


def shape_label(shape: Shape) -> str:
    """A compact label such as ``[4096, 14336]`` in argument order."""
    return "[" + ", ".join(str(v) for v in shape.values()) + "]"


def shape_key(shape: Shape) -> tuple[tuple[str, int], ...]:
    """A hashable key of a shape, the same whatever the order of its items."""
    return tuple(sorted((k, int(v)) for k, v in shape.items()))


# Kernel attributes that may sit before or after ``void``: launch bounds and (sm_90) a
# compile-time cluster shape.
ENTRY_ATTRS = r'(?:(?:__launch_bounds__|__cluster_dims__)\s*\([^)]*\)\s*)*'
_SIG_RE = r'extern\s+"C"\s+__global__\s+' + ENTRY_ATTRS + r'void\s+' + ENTRY_ATTRS + r'{name}\s*\(([^)]*)\)'
_QUALIFIERS = {"const", "__restrict__", "__restrict", "restrict", "volatile"}


def check_signature(spec: KernelSpec, source: str) -> None:
    """Checks that the variant defines the entry point once with the spec's argument list;
    declarations of it (the signature followed by ``;``, as a forward declaration) may come
    before the definition, and are held to the same argument list.

    Raises:
        KernelSpecError: the entry is missing or defined more than once, or its parameters
            differ in count or type.
    """
    found = list(re.finditer(_SIG_RE.format(name=re.escape(spec.name)), source))
    definitions = [m for m in found if not source[m.end():].lstrip().startswith(";")]
    if not definitions:
        raise KernelSpecError(
            f'no entry point `extern "C" __global__ void {spec.name}(...)` in the variant'
            + (" (only a declaration)" if found else "")
        )
    if len(definitions) > 1:
        raise KernelSpecError(f"the entry point {spec.name} is defined more than once")
    for m in found:
        _check_params(spec, m.group(1))


def _check_params(spec: KernelSpec, text: str) -> None:
    """The parameter list ``text`` of an entry's declaration or definition against the spec."""
    params = [p.strip() for p in text.split(",") if p.strip()]
    expected = spec.c_signature()
    if len(params) != len(expected):
        raise KernelSpecError(
            f"{spec.name} must take {len(expected)} arguments ({', '.join(a.name for a in spec.args)}), "
            f"the variant declares {len(params)}"
        )
    for arg, param, (ctype, is_ptr) in zip(spec.args, params, expected, strict=True):
        tokens = [t for t in re.findall(r"[A-Za-z_][A-Za-z0-9_]*|\*", param) if t not in _QUALIFIERS]
        stars = tokens.count("*")
        words = [t for t in tokens if t != "*"]
        base = " ".join(words[:-1]) if len(words) > 1 else (words[0] if words else "")
        if stars != int(is_ptr) or base != ctype:
            want = f"{ctype}{'*' if is_ptr else ''}"
            raise KernelSpecError(f"argument {arg.name} must be of type {want}, the variant has {param!r}")


def _load_module(path: Path, module_name: str) -> Any:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise KernelSpecError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except KernelSpecError:
        sys.modules.pop(module_name, None)
        raise
    except Exception as exc:  # the folder's own code failed (syntax, an import, a bad argument): its error
        sys.modules.pop(module_name, None)
        raise KernelSpecError(f"{path} cannot be loaded: {type(exc).__name__}: {' '.join(str(exc).split())}"[:400]) from exc
    return module


def _module_name(directory: Path) -> str:
    """The name a spec.py is imported under: unique per folder (two libraries may both hold a
    folder ``rmsnorm``; neither may replace the other's module)."""
    where = hashlib.sha256(str(directory.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"_kernel_spec_{re.sub(r'[^A-Za-z0-9_]', '_', directory.name)}_{where}"


def kernel_folder(name_or_dir: str | Path) -> Path:
    """The folder of a kernel given as a folder path or as a library name.

    Raises:
        KernelSpecError: neither a folder with a ``spec.py`` nor a library kernel.
    """
    path = Path(name_or_dir)
    directory = path if path.is_dir() else LIBRARY_DIR / str(name_or_dir)
    if not (directory / "spec.py").is_file():
        known = ", ".join(list_kernels()) or "none"
        raise KernelSpecError(f"no kernel {str(name_or_dir)!r}: {directory / 'spec.py'} does not exist "
                              f"(library: {known})")
    return directory


def kernel_ref(name_or_dir: str | Path, name: str = "") -> KernelRef:
    """A reference to a kernel given as a folder path or a library name (its files now).

    Raises:
        KernelSpecError: no such kernel folder.
    """
    return KernelRef.of(kernel_folder(name_or_dir), name)


def load_kernel(kernel: KernelRef | str | Path) -> KernelSpec:
    """Loads a kernel by reference (the folder with the files the reference names, found
    with :func:`kernels.folders.resolve_folder`), by folder path, or by library name
    (``silu_and_mul``).

    Raises:
        KernelSpecError: the folder, ``spec.py``, ``SPEC`` or ``baseline.cu`` is missing, the
            folder no longer holds the reference's files, or the baseline's launch header or
            signature does not fit the spec.
    """
    directory = kernel.resolve() if isinstance(kernel, KernelRef) else kernel_folder(kernel)
    spec_file = directory / "spec.py"
    if not spec_file.is_file():
        raise KernelSpecError(f"kernel folder {directory} has no spec.py")
    module = _load_module(spec_file, _module_name(directory))
    spec = getattr(module, "SPEC", None)
    if not isinstance(spec, KernelSpec):
        raise KernelSpecError(f"{spec_file} must define SPEC = KernelSpec(...)")
    object.__setattr__(spec, "directory", directory.resolve())
    if not spec.baseline_path.is_file():
        raise KernelSpecError(f"{spec.name}: missing {spec.baseline_path}")
    source = spec.baseline_source()
    try:
        spec.check_launch(parse_launch_header(source))
    except LaunchSpecError as exc:
        raise KernelSpecError(f"{spec.name}: baseline launch header: {exc}") from None
    check_signature(spec, source)
    return spec


@functools.lru_cache(maxsize=64)
def cached_kernel(kernel: KernelRef | str) -> KernelSpec:
    """:func:`load_kernel`, once per process and reference. Specs hold functions from
    dynamically imported modules, so they are cached, never pickled; the key is the reference
    (folder and digest) or the name given, so kernels of one name from two libraries, or a
    folder whose files changed, are different keys."""
    return load_kernel(kernel)


def list_kernels(library: Path = LIBRARY_DIR) -> list[str]:
    """Names of the kernels in a library folder (each subfolder with a spec.py)."""
    return sorted(p.parent.name for p in Path(library).glob("*/spec.py"))


def load_library(library: Path = LIBRARY_DIR, names: Sequence[str] | None = None) -> list[KernelSpec]:
    chosen = names if names else list_kernels(library)
    return [load_kernel(Path(library) / n) for n in chosen]
