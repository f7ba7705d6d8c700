"""``python -m kernels.check DIR...``: checks kernel folders as a whole, without a GPU.

DIR is a kernel folder (``spec.py`` and ``baseline.cu``) or a folder of kernel folders. For
each kernel: the spec loads (argument list, shape symbols with their ``min_value`` and
``multiple_of``, held-out shapes apart from the search shapes, the baseline's launch header
and signature); ``make_inputs`` sizes every shape on the meta device, drawn held-out shapes
included; ``bytes_moved`` and ``flops`` give counts; the baseline's launch fits the device on
every shape and, for every run dtype, the baseline passes what admission checks of a source
and its binary (:mod:`kernels.compile_checks`) and compiles with NVRTC (which runs on the
CPU; outcomes are cached); the reference runs on the CPU at the smallest search shape for
every input case (:mod:`kernels.check_run`); and the baseline itself runs on the CPU emulator
at the two smallest search shapes, every run dtype and input case, against the reference
(:mod:`kernels.cpu_check`; verdicts are cached): a baseline that computes the wrong thing is a
problem. A baseline the emulator cannot run (inline PTX, clusters) is not a problem, but its
OK line says that its outputs were not checked. Output: one line per problem,
``<folder>: <problem>``, and exit 1; or one OK line per kernel and exit 0.

The search runs the same checks on its kernels before it starts (:func:`preflight`) and
stops with the first problem on one line.

Examples::

    python -m kernels.check kernels                  # the whole library
    python -m kernels.check ~/my_kernels/swiglu      # one folder
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from kernels.check_run import describe_error, run_case, smallest_shape
from kernels.compile_checks import CompileRefused, check_services, check_source_routes
from kernels.launch import (
    DeviceLimits,
    LaunchSpec,
    LaunchSpecError,
    check_limits,
    parse_launch_header,
)
from kernels.nvrtc import (
    DEFAULT_ARCH,
    build_options,
    cache_key,
    cache_root,
    compile_program,
    entry_compiled,
    full_source,
)
from kernels.records import atomic_write
from kernels.spec import (
    KernelSpec,
    KernelSpecError,
    Shape,
    list_kernels,
    load_kernel,
    shape_key,
    shape_label,
)

HELDOUT_DRAW_SEEDS = (0, 1)  # draws checked: each run draws its own from its seed
# Where a problem names the dtype or the input case it was found at.
_DTYPE_MARK, _CASE_MARK = "\0dtype\0", "\0case\0"


class KernelCheckError(KernelSpecError):
    """A kernel the search must not start with; the message is one line naming its folder."""


def kernel_folders(path: Path) -> list[Path]:
    """The kernel folders a command-line DIR names: itself when it holds spec.py and
    baseline.cu, else its subfolders with a spec.py, else itself when it holds a spec.py
    (whose missing baseline is then reported)."""
    if (path / "spec.py").is_file() and (path / "baseline.cu").is_file():
        return [path]
    inside = [path / name for name in list_kernels(path)] if path.is_dir() else []
    return inside or ([path] if (path / "spec.py").is_file() else [])


def _first_error(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no log"])[0][:300]


def compile_problem(source: str, entry: str, dtype: str, arch: str = DEFAULT_ARCH) -> str | None:
    """Why the baseline would not pass admission for ``dtype`` at its default parameters, or
    None: the static checks of its source (includes, directives, flags), the NVRTC compile,
    and its binary (the entry kernel, no device printf, heap or assert).

    Outcomes are cached on disk (under the compile cache's ``check/``) by everything that
    changes them, so checking an unchanged library again costs no compile.
    """
    try:
        check_source_routes(source)
        defines = parse_launch_header(source).default_params()
        options = build_options(source, dtype, defines, arch)
    except (LaunchSpecError, CompileRefused) as exc:
        return f"baseline refused before compiling: {' '.join(str(exc).split())}"
    key = cache_key(source, options, entry)
    path = cache_root() / "check" / key[:2] / f"{key}.json"
    if path.is_file():
        return json.loads(path.read_text())["problem"]
    out = compile_program(full_source(source), options)
    problem = None
    if not out.ok:
        problem = f"baseline does not compile for {dtype}: {_first_error(out.log)}"
    elif not entry_compiled(out.log, out.cubin, entry):
        problem = f'baseline compiles for {dtype} but holds no kernel named {entry} (extern "C" __global__)'
    else:
        try:
            check_services(out.cubin)
        except CompileRefused as exc:
            problem = f"baseline refused for {dtype}: {exc}"
    atomic_write(path, json.dumps({"problem": problem}).encode())
    return problem


def _meta_size(spec: KernelSpec, shape: Shape) -> int | str:
    """Elements of all the shape's tensors, made on the meta device, or why make_inputs fails."""
    try:
        return sum(spec.tensor_elements(shape).values())
    except Exception as exc:
        return describe_error(exc)


def _shape_problems(spec: KernelSpec, which: str, shape: Shape, launch: LaunchSpec,
                    sizes: dict[tuple[tuple[str, int], ...], int | str]) -> dict[str, str]:
    """One shape's problems by kind: sizing on the meta device, the counts, the launch."""
    at = f"{which} shape {shape_label(shape)}"
    found: dict[str, str] = {}
    key = shape_key(shape)
    if key not in sizes:
        sizes[key] = _meta_size(spec, shape)
    if isinstance(sizes[key], str):
        found["meta"] = f"make_inputs fails on the meta device at {at} (the evaluator sizes shapes there): {sizes[key]}"
    for dtype in spec.dtypes:
        try:
            moved = spec.bytes_moved(shape, dtype)
            if not isinstance(moved, int) or moved <= 0:
                found["bytes"] = f"bytes_moved gives {moved!r} at {at} ({dtype}), not a positive int"
        except Exception as exc:
            found["bytes"] = f"bytes_moved fails at {at} ({dtype}): {describe_error(exc)}"
        if "bytes" in found:
            break
    try:
        flops = spec.flops(shape)
        if not isinstance(flops, int) or flops < 0:
            found["flops"] = f"flops gives {flops!r} at {at}, not a non-negative int"
    except Exception as exc:
        found["flops"] = f"flops fails at {at}: {describe_error(exc)}"
    try:
        check_limits(launch.resolve(shape, launch.default_params()), DeviceLimits(), f"at {at}")
    except LaunchSpecError as exc:
        found["launch"] = f"baseline launch: {exc}"
    return found


def static_problems(spec: KernelSpec, sizes: dict[tuple[tuple[str, int], ...], int | str]) -> list[str]:
    """What can be checked without running the reference, on every shape (search, held-out,
    drawn held-out): sizing on the meta device (into ``sizes``), the counts, and the baseline's
    launch within the device's limits. Each kind of problem is said once, at its first shape."""
    problems: list[str] = []
    shapes: list[tuple[str, Shape]] = [("search", s) for s in spec.search_shapes]
    shapes += [("held-out", s) for s in spec.heldout_shapes]
    for seed in HELDOUT_DRAW_SEEDS:
        try:
            shapes += [(f"drawn held-out (seed {seed})", s) for s in spec.draw_heldout(seed)]
        except Exception as exc:
            problems.append(f"heldout_draw fails for seed {seed}: {describe_error(exc)}")
            break
    launch = parse_launch_header(spec.baseline_source())  # load_kernel checked it parses
    by_kind: dict[str, list[str]] = {}
    for which, shape in shapes:
        for kind, message in _shape_problems(spec, which, shape, launch, sizes).items():
            by_kind.setdefault(kind, []).append(message)
    for messages in by_kind.values():
        more = f" (and at {len(messages) - 1} more shape(s))" if len(messages) > 1 else ""
        problems.append(messages[0] + more)
    if len(set(spec.edge_cases)) != len(spec.edge_cases) or "random" in spec.edge_cases:
        problems.append(f"edge_cases {list(spec.edge_cases)} must be distinct names other than 'random'")
    problems += description_problems(spec.description)
    return problems


def description_problems(description: str) -> list[str]:
    """The description is what the agents read about the kernel: it must exist and must not
    be the ``kernels.new`` template's placeholder."""
    if not description.strip():
        return ["description is empty: say what the kernel computes (layout, math, alignment) for the agents"]
    if "TODO" in description:
        return [f"description still says TODO ({' '.join(description.split())[:80]!r}): say what the kernel "
                "computes (layout, math, alignment) for the agents"]
    return []


def _merge_runs(found: dict[str, tuple[list[str], list[str]]]) -> list[str]:
    """Problems found alike at several dtypes or input cases, said once with the dtypes and
    cases listed; of the ``bytes_moved`` floors, only the first (the others follow from it)."""
    merged, floor_said = [], False
    for template, (dtypes, cases) in found.items():
        if template.startswith("bytes_moved gives"):
            if floor_said:
                continue
            floor_said = True
        merged.append(template.replace(_DTYPE_MARK, ", ".join(dtypes)).replace(_CASE_MARK, ", ".join(cases)))
    return merged


def cpu_problem(spec: KernelSpec, dtype: str, unchecked: list[str] | None = None) -> str | None:
    """Why the baseline's outputs on the CPU emulator are wrong at ``dtype`` (INCORRECT, or
    it crashed there), or None; where the emulator cannot run it, the reason goes to
    ``unchecked`` instead (not a problem: the GPU evaluator checks it)."""
    from kernels.cpu_check import UNVERIFIED, check_on_cpu

    verdict = check_on_cpu(spec, spec.baseline_source(), dtype)
    if verdict.guard == UNVERIFIED:
        if unchecked is not None:
            unchecked.append(verdict.message)
        return None
    if verdict.verified:
        return None
    return f"baseline {verdict.status.value}: {verdict.message}"


def check_spec(spec: KernelSpec, dtypes: Sequence[str] | None = None, cpu: bool = True,
               unchecked: list[str] | None = None) -> list[str]:
    """Every problem of a loaded spec, in order, each once (``dtypes``: the run dtypes to
    compile and run, default all the spec's; ``cpu``: run the baseline on the CPU emulator
    too, noting in ``unchecked`` where it cannot)."""
    sizes: dict[tuple[tuple[str, int], ...], int | str] = {}
    problems = static_problems(spec, sizes)
    shape = smallest_shape(spec, sizes)
    found: dict[str, tuple[list[str], list[str]]] = {}

    def note(message: str | None, dtype: str, case: str = "") -> None:
        if not message:
            return
        template = re.sub(rf"(?<![A-Za-z0-9_]){dtype}(?![A-Za-z0-9_])", _DTYPE_MARK, message)
        if case:
            template = template.replace(f"(case {case},", f"(case {_CASE_MARK},")
        seen_dtypes, seen_cases = found.setdefault(template, ([], []))
        for value, seen in ((dtype, seen_dtypes), (case, seen_cases)):
            if value and value not in seen:
                seen.append(value)

    for dtype in dtypes or spec.dtypes:
        compiled = compile_problem(spec.baseline_source(), spec.name, dtype)
        note(compiled, dtype)
        clean = compiled is None and not problems
        for case in ("random", *spec.edge_cases):
            for message in run_case(spec, shape, dtype, case):
                note(message, dtype, case)
                clean = False
        if cpu and clean:  # the baseline is held to inputs and a reference that are sound
            wrong = cpu_problem(spec, dtype, unchecked)
            note(wrong, dtype)
            cpu = not wrong  # one dtype's mismatch is enough to say (the others differ in numbers only)
    return list(dict.fromkeys(problems + _merge_runs(found)))


def check_folder(folder: Path, dtypes: Sequence[str] | None = None,
                 unchecked: list[str] | None = None) -> tuple[KernelSpec | None, list[str]]:
    """Loads and checks one kernel folder: (the spec if it loaded, its problems); why the
    baseline could not run on the CPU, if so, goes to ``unchecked``."""
    try:
        spec = load_kernel(folder)
    except KernelSpecError as exc:
        return None, [" ".join(str(exc).split())]
    except Exception as exc:  # spec.py itself fails: a syntax error, an import, a bad argument
        return None, [f"spec.py cannot be loaded: {describe_error(exc)}"]
    return spec, check_spec(spec, dtypes, unchecked=unchecked)


def preflight(specs: Iterable[KernelSpec], dtype: str, cpu: bool = False) -> None:
    """The checks of ``python -m kernels.check`` for the kernels a run is about to search, at
    the run's dtype; the baseline's CPU run only with ``cpu`` (a stand-in run: on a GPU the
    evaluator checks the baseline's outputs).

    Raises:
        KernelCheckError: the first problem found, on one line naming the kernel's folder, and
            how many more there are.
    """
    for spec in specs:
        problems = check_spec(spec, (dtype,), cpu=cpu)
        if problems:
            more = f" (and {len(problems) - 1} more: python -m kernels.check {spec.directory})" if len(problems) > 1 else ""
            raise KernelCheckError(f"{spec.directory}: {problems[0]}{more}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a kernel folder or a folder of them")
    args = p.parse_args(argv)
    bad = 0
    for given in args.dirs:
        folders = kernel_folders(given)
        if not folders:
            print(f"{given}: not a kernel folder (no spec.py) and holds no kernel folders (NAME/spec.py)")
            bad += 1
        for folder in folders:
            unchecked: list[str] = []
            spec, problems = check_folder(folder, unchecked=unchecked)
            for problem in problems:
                print(f"{folder}: {problem}")
            bad += bool(problems)
            if spec is not None and not problems:
                cases = 1 + len(spec.edge_cases)
                ran = (f"baseline outputs {unchecked[0]}" if unchecked else
                       "baseline matches it on the CPU emulator at small shapes")
                print(f"{folder}: OK ({spec.name}: baseline compiles for {', '.join(spec.dtypes)}; reference "
                      f"checked on {cases} input case(s); {ran})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
