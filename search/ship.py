"""``python -m search.ship RUN_DIR [RUN_DIR...] --out DIR``: a run's winners as a PyTorch package.

Writes ``DIR/<name>/``, a self-contained Python package (torch and NVIDIA's ``cuda-bindings``
at run time; nothing of this engine, no CuPy, no compiler) with one ``torch.library`` op per
kernel, and ``DIR/pyproject.toml`` so that ``pip install DIR`` works too. Each op carries
the winner's cubin for every dtype shipped (several runs, one dtype each, merge into one
package), the source it was compiled from, and the evidence the run gathered (speedups,
held-out and sanitizer verdicts, the evaluator's per-shape times) in ``manifest.json``.

The cubins come from admission (:func:`evaluators.admit.admit`, the compile the evaluator
uses, on the CPU): the binary is reproduced when its compile key (source, options,
architecture, NVRTC version) equals the one the run recorded. Without ``--arch`` the
architecture is the one that reproduces it; with ``--arch`` a fresh compile for another
target is shipped and marked as not the evaluated binary. A stand-in run ships too (its
cubins are real NVRTC output; its evidence is marked synthetic).

See docs/ship.md for the ops' conventions.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import kernels.dispatch_rule
import kernels.launch
from evaluators.admit import Artifact, admit
from evaluators.compile import DEFAULT_ARCH, nvrtc_version, target_arch
from kernels.folders import KernelRef
from kernels.records import EvalRecord, Stage, atomic_write
from kernels.spec import KernelSpec, KernelSpecError, load_kernel, shape_label
from search.report import git_commit
from search.ship_dims import DimsError, arg_infos, derive_dims, manifest_dims

TEMPLATE_DIR = Path(__file__).resolve().parent / "ship_template"
TEMPLATE_FILES = ("__init__.py", "_checks.py", "_errors.py", "_ops.py", "_runtime.py")
# Verbatim copies of the engine's own standard-library modules, so the package resolves
# launches and dispatch exactly as the run did without importing the engine.
COPIED = {"_launch.py": kernels.launch, "_dispatch.py": kernels.dispatch_rule}
REPO_ROOT = Path(__file__).resolve().parent.parent
FORMAT = 1
ALIGN_BYTES = 16  # the widest vector access of our kernels; torch's allocator gives 512
# Targets tried, after this machine's, to find the one that reproduces a run's binary.
COMMON_ARCHS = ("sm_90", "sm_80", "sm_89", "sm_86", "sm_100", "sm_120", "sm_75")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ShipError(ValueError):
    """Nothing can be shipped as asked; the message (one line) says why and what to do."""


@dataclass(frozen=True)
class Member:
    """A kernel dispatched by shape beside a winner (:mod:`search.dispatch`)."""

    source: str
    params: dict[str, int]
    variant_id: str
    compile_key: str


@dataclass(frozen=True)
class Winner:
    """One kernel's winner of one run, with what the package needs to ship it; ``members``
    and ``dispatch`` (``{"shapes": search shapes, "table": member index per shape}``, 0
    being the winner) when the run dispatched several kernels by shape."""

    run_dir: Path
    name: str  # the kernel's name in the run (file names under best/)
    spec: KernelSpec
    dtype: str
    source: str
    params: dict[str, int]
    variant_id: str
    compile_key: str  # as recorded for the final evaluation ('' if the run has none)
    evidence: dict[str, Any]
    members: tuple[Member, ...] = ()
    dispatch: dict[str, Any] | None = None

    @property
    def own(self) -> Member:
        """The winner's own kernel, as its members are given."""
        return Member(self.source, self.params, self.variant_id, self.compile_key)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ShipError(f"{path} does not exist") from None


def _load_spec(entry: dict[str, Any]) -> KernelSpec:
    ref = entry.get("kernel_ref")
    try:
        return load_kernel(KernelRef.from_dict(ref) if ref else entry["kernel"])
    except KernelSpecError as exc:
        raise ShipError(f"kernel {entry['kernel']}: {exc}") from None


def _final_compile_key(best: dict[str, Any], variant_id: str, params: dict[str, int]) -> str:
    for d in best.get("evaluations", []) + [e for m in best.get("dispatch", {}).get("members", [])
                                             for e in m.get("evaluations", [])]:
        rec = EvalRecord.from_dict(d)
        if rec.stage is Stage.FINAL and rec.variant.id == variant_id and rec.params == params:
            return rec.compile_key
    return ""


def _evidence(summary: dict[str, Any], entry: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    """What the run measured and checked for this winner (synthetic for a stand-in run)."""
    sanitizer = best.get("sanitizer", {})
    return {
        "run_id": summary.get("run_id", ""),
        "git_commit": summary.get("git_commit", ""),
        "date": summary.get("date", ""),
        "gpu": summary.get("gpu", ""),
        "evaluator": summary.get("evaluator", ""),
        "synthetic": summary.get("evaluator") == "standin",
        "speedup_search": entry.get("speedup_search"),
        "speedup_heldout": entry.get("speedup_heldout"),
        "heldout_status": entry.get("heldout_status"),
        "final_status": entry.get("final_status"),
        "speedup_over_peers": entry.get("speedup_over_peers", {}),
        "sanitizer_status": sanitizer.get("status", ""),
        "sanitizer_summary": sanitizer.get("summary", ""),
        "rejected_why": best.get("rejected_why", {}),
        "shapes": [{"shape": s["shape"], "best_ms": s.get("best_ms"), "baseline_ms": s.get("baseline_ms"),
                    "loop_ms": s.get("loop_ms", {})} for s in entry.get("shapes", [])],
        "lineage": best.get("lineage", []),
    }


def read_winners(run_dir: Path) -> list[Winner]:
    """The winners of one finished run (its ``summary.json`` and ``best/``).

    Raises:
        ShipError: the folder is not a finished run, or a kernel's folder cannot be loaded.
    """
    summary = _read_json(run_dir / "summary.json")
    winners = []
    for entry in summary.get("kernels", []):
        name = entry["kernel"]
        best = _read_json(run_dir / "best" / f"{name}.json")
        source = (run_dir / "best" / f"{name}.cu").read_text()
        params = {k: int(v) for k, v in best["params"].items()}
        variant_id = best["variant"]["id"]
        members, dispatch = _members(best)
        winners.append(Winner(run_dir, name, _load_spec(entry), best["dtype"], source, params, variant_id,
                              _final_compile_key(best, variant_id, params), _evidence(summary, entry, best),
                              members, dispatch))
    if not winners:
        raise ShipError(f"{run_dir}: summary.json lists no kernels")
    return winners


def _members(best: dict[str, Any]) -> tuple[tuple[Member, ...], dict[str, Any] | None]:
    """The kernels dispatched beside the winner, and the table that places them."""
    d = best.get("dispatch")
    if not d:
        return (), None
    members = []
    for m in d["members"][1:]:
        params = {k: int(v) for k, v in m["params"].items()}
        vid = m["variant"]["id"]
        members.append(Member(m["variant"]["source"], params, vid, _final_compile_key(best, vid, params)))
    shapes = [dict(s) for s in d["search_shapes"]]
    return tuple(members), {"shapes": shapes, "table": [int(d["table"][shape_label(s)]) for s in shapes]}


def collect(run_dirs: Sequence[Path]) -> list[Winner]:
    """Every run's winners; one per (kernel, dtype).

    Raises:
        ShipError: two runs have a winner for the same kernel and dtype.
    """
    seen: dict[tuple[str, str], Path] = {}
    out = []
    for run_dir in run_dirs:
        for w in read_winners(run_dir):
            key = (w.spec.name, w.dtype)
            if key in seen:
                raise ShipError(f"{w.spec.name} ({w.dtype}) has winners in {seen[key]} and {run_dir}; "
                                f"ship one of the two runs")
            seen[key] = run_dir
            out.append(w)
    return out


def _compile(w: Winner, arch: str, member: Member | None = None) -> Artifact:
    m = member or w.own
    outcome = admit(w.spec, m.source, w.dtype, m.params, arch=arch)
    if not isinstance(outcome, Artifact):
        raise ShipError(f"{w.spec.name} ({w.dtype}) from {w.run_dir}: {outcome.status.value}: "
                        f"{' '.join(outcome.message.split())[:300]}")
    return outcome


def choose_arch(winners: Sequence[Winner]) -> str:
    """The architecture whose compile reproduces the first recorded binary.

    Raises:
        ShipError: no candidate reproduces it (another NVRTC than the run's?).
    """
    recorded = [w for w in winners if w.compile_key]
    if not recorded:
        return target_arch()
    w = recorded[0]
    for arch in dict.fromkeys((target_arch(), DEFAULT_ARCH, *COMMON_ARCHS)):
        outcome = admit(w.spec, w.source, w.dtype, w.params, arch=arch)
        if isinstance(outcome, Artifact) and outcome.compile_key == w.compile_key:
            return arch
    raise ShipError(f"cannot reproduce the binary {w.spec.name} ({w.dtype}) was evaluated with: NVRTC "
                    f"{nvrtc_version()} here may not be the run's; pass --arch to ship a fresh compile")


def _kernel_entry(spec: KernelSpec, dims: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": spec.description,
        "args": [asdict(a) for a in arg_infos(spec)],
        "constants": dict(spec.constants),
        "dims": dims,
        "builds": {},
    }


def build(winners: Sequence[Winner], out: Path, name: str, arch: str | None = None,
          command: str = "") -> Path:
    """Writes the package ``out/name`` (and ``out/pyproject.toml``); returns its folder.

    Raises:
        ShipError: a bad name, a winner that does not compile, or a binary that cannot be
            reproduced without ``arch``.
    """
    if not _NAME_RE.match(name):
        raise ShipError(f"--name {name!r} must be a Python identifier (it is the package and op namespace)")
    chosen = arch or choose_arch(winners)
    pkg = out / name
    if pkg.exists():
        shutil.rmtree(pkg)
    (pkg / "cubins").mkdir(parents=True)
    (pkg / "sources").mkdir()
    manifest: dict[str, Any] = {
        "format": FORMAT, "namespace": name, "arch": chosen, "nvrtc": nvrtc_version(), "align_bytes": ALIGN_BYTES,
        "built": {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  "git_commit": git_commit(REPO_ROOT), "command": command},
        "kernels": {}, "skipped": {},
    }
    for w in winners:
        try:
            dims = manifest_dims(derive_dims(w.spec))
        except DimsError as exc:
            manifest["skipped"][w.spec.name] = str(exc)
            print(f"skipped {w.spec.name}: {exc}", file=sys.stderr)
            continue
        stem = f"{w.spec.name}.{w.dtype}"
        entry = manifest["kernels"].setdefault(w.spec.name, _kernel_entry(w.spec, dims))
        build_entry = {**_ship_kernel(w, w.own, chosen, arch, pkg, stem),
                       "run_dir": str(w.run_dir.resolve()), "evidence": w.evidence}
        entry["builds"][w.dtype] = build_entry
        if w.members and w.dispatch:
            # Kernels dispatched by shape beside the winner: member i's cubin is launched on
            # the shapes the table gives it (kernels/dispatch_rule.py, copied as _dispatch.py).
            build_entry["members"] = [_ship_kernel(w, m, chosen, arch, pkg, f"{stem}.{i}")
                                      for i, m in enumerate(w.members, 1)]
            build_entry["dispatch"] = w.dispatch
    if not manifest["kernels"]:
        raise ShipError("no kernel could be shipped: " + "; ".join(manifest["skipped"].values()))
    for file in TEMPLATE_FILES:
        shutil.copyfile(TEMPLATE_DIR / file, pkg / file)
    # The package resolves launch headers and dispatch with the engine's own modules.
    for file, module in COPIED.items():
        shutil.copyfile(Path(str(module.__file__)), pkg / file)
    atomic_write(pkg / "manifest.json", json.dumps(manifest, indent=2, default=str))
    atomic_write(pkg / "README.md", readme(manifest))
    atomic_write(out / "pyproject.toml", _pyproject(name))
    return pkg


def _ship_kernel(w: Winner, m: Member, chosen: str, arch: str | None, pkg: Path, stem: str) -> dict[str, Any]:
    """Compiles one kernel of a winner for ``chosen``, writes its cubin and source as ``stem``
    and returns its build entry.

    Raises:
        ShipError: without ``arch``, a compile that is not the binary the run evaluated.
    """
    artifact = _compile(w, chosen, m)
    if arch is None and m.compile_key and artifact.compile_key != m.compile_key:
        what = "" if m.variant_id == w.variant_id else f" of dispatch member {m.variant_id}"
        raise ShipError(f"{w.spec.name} ({w.dtype}): the compile{what} for {chosen} is not the binary the run "
                        f"evaluated; pass --arch to ship a fresh compile anyway")
    atomic_write(pkg / "cubins" / f"{stem}.cubin", artifact.cubin)
    atomic_write(pkg / "sources" / f"{stem}.cu", m.source)
    return {"cubin": f"cubins/{stem}.cubin", "source": f"sources/{stem}.cu", "params": artifact.params,
            "variant_id": m.variant_id, "compile_key": artifact.compile_key,
            "binary_as_evaluated": bool(m.compile_key) and artifact.compile_key == m.compile_key,
            "cubin_sha256": hashlib.sha256(artifact.cubin).hexdigest(), "registers": artifact.registers}


def readme(manifest: dict[str, Any]) -> str:
    """A short table of what the package holds and the evidence behind each op."""
    lines = [f"# {manifest['namespace']}", "",
             f"Kernels as torch.library ops (`torch.ops.{manifest['namespace']}.*`), cubins for "
             f"{manifest['arch']} built with NVRTC {manifest['nvrtc']}. Outputs are written in place; "
             "ops return None. Made by `" + manifest["built"]["command"] + "`.", "",
             "| op | dtype | kernels | speedup over baseline (search / held-out) | held-out | sanitizer | evaluator | GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for kernel, entry in manifest["kernels"].items():
        for dtype, b in entry["builds"].items():
            ev = b["evidence"]
            speed = " / ".join(f"{v:.2f}x" if isinstance(v, int | float) else "-"
                               for v in (ev["speedup_search"], ev["speedup_heldout"]))
            synthetic = " (synthetic)" if ev["synthetic"] else ""
            kernels = 1 + len(b.get("members", []))
            lines.append(f"| {kernel} | {dtype} | {kernels}{' (by shape)' if kernels > 1 else ''} | "
                         f"{speed}{synthetic} | {ev['heldout_status']} | "
                         f"{ev['sanitizer_status']} | {ev['evaluator']} | {ev['gpu']} |")
    for kernel, why in manifest["skipped"].items():
        lines.append(f"\nNot shipped: {kernel}: {why}")
    return "\n".join(lines) + "\n"


def _pyproject(name: str) -> str:
    return (f'[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{name.replace("_", "-")}"\nversion = "0.1.0"\nrequires-python = ">=3.10"\n'
            f'dependencies = ["torch>=2.4", "cuda-bindings>=12.8"]\n\n'
            f'[tool.setuptools]\npackages = ["{name}"]\n\n'
            f'[tool.setuptools.package-data]\n{name} = ["manifest.json", "README.md", "cubins/*", "sources/*"]\n')


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m search.ship", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="finished run directories")
    p.add_argument("--out", type=Path, required=True, help="folder to write the package into")
    p.add_argument("--name", default="kernel_ops", help="package name and op namespace (default kernel_ops)")
    p.add_argument("--arch", help="compile for this target (e.g. sm_90) instead of the run's")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m search.ship " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    try:
        pkg = build(collect(args.runs), args.out, args.name, args.arch, command)
    except ShipError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    manifest = json.loads((pkg / "manifest.json").read_text())
    ops = ", ".join(f"{k} ({', '.join(sorted(e['builds']))})" for k, e in manifest["kernels"].items())
    print(f"wrote {pkg}: {ops}; cubins for {manifest['arch']}, NVRTC {manifest['nvrtc']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
