"""search.ship on the CPU: a package built from stand-in runs imports without the engine or a
GPU, its ops trace under torch.compile with fake tensors, its argument checks raise the
documented errors, the architecture check refuses a foreign GPU in one line, and the launch
path packs the kernel's C arguments as the driver expects (with a stand-in driver)."""

from __future__ import annotations

import ctypes
import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kernels.spec import load_kernel
from search import ship
from search.ship_dims import DimsError, derive_dims

ROOT = Path(__file__).resolve().parents[2]
NAME = "ship_test_ops"  # the op namespace: registered once per test process
MODEL_KERNELS = ("silu_and_mul", "fused_add_rmsnorm", "rotary_embedding_neox")
ENGINE = {"kernels", "evaluators", "agents", "search", "experiments", "cupy"}


def _standin_run(out: Path, dtype: str, kernels: tuple[str, ...]) -> Path:
    cmd = [sys.executable, "-m", "search.run", "--evaluator", "standin", "--rounds", "1", "--population", "1",
           "--dtype", dtype, "--out", str(out)]
    for k in kernels:
        cmd += ["--kernel", k]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A bfloat16 run of the three model kernels and a float16 run of silu_and_mul."""
    base = tmp_path_factory.mktemp("runs")
    return [_standin_run(base / "bf16", "bfloat16", MODEL_KERNELS), _standin_run(base / "fp16", "float16",
                                                                                  ("silu_and_mul",))]


@pytest.fixture(scope="module")
def shipped(runs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shipped")
    assert ship.main([*map(str, runs), "--out", str(out), "--name", NAME]) == 0
    return out


@pytest.fixture(scope="module")
def pkg(shipped: Path) -> Any:
    sys.path.insert(0, str(shipped))
    try:
        yield importlib.import_module(NAME)
    finally:
        sys.path.remove(str(shipped))


def test_the_package_holds_every_dtype_of_every_run_with_its_evidence(shipped: Path, runs: list[Path]):
    manifest = json.loads((shipped / NAME / "manifest.json").read_text())
    assert manifest["arch"] == "sm_90" and manifest["nvrtc"] and manifest["namespace"] == NAME
    assert set(manifest["kernels"]) == set(MODEL_KERNELS)
    assert set(manifest["kernels"]["silu_and_mul"]["builds"]) == {"bfloat16", "float16"}
    for entry in manifest["kernels"].values():
        for build in entry["builds"].values():
            # the stand-in compiled with NVRTC for sm_90 too: the shipped binary is the evaluated one
            assert build["binary_as_evaluated"] is True
            assert (shipped / NAME / build["cubin"]).read_bytes()[:4] == b"\x7fELF"
            assert (shipped / NAME / build["source"]).read_text().count("// launch:") == 1
            evidence = build["evidence"]
            assert evidence["synthetic"] is True and evidence["evaluator"] == "standin"
            assert evidence["heldout_status"] == "OK" and evidence["speedup_search"] > 0 and evidence["shapes"]
    assert (shipped / "pyproject.toml").is_file() and "(synthetic)" in (shipped / NAME / "README.md").read_text()
    # the launch headers are resolved by the evaluator's own module, copied verbatim
    assert (shipped / NAME / "_launch.py").read_bytes() == (ROOT / "kernels" / "launch.py").read_bytes()


def test_the_package_imports_without_the_engine_or_a_gpu(shipped: Path, tmp_path: Path):
    code = (f"import sys; sys.path.insert(0, {str(shipped)!r}); import {NAME} as p, torch; "
            f"print(sorted(p.ops)); print(sorted({{m.split('.')[0] for m in sys.modules}})); "
            f"print(torch.cuda.is_initialized())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ops, modules, touched = proc.stdout.strip().splitlines()
    assert ops == str(sorted(MODEL_KERNELS))
    assert not ENGINE & set(eval(modules))
    assert touched == "False"  # CUDA is first touched by a launch (or load())


def test_op_schemas_follow_the_in_place_convention(pkg: Any):
    schema = str(getattr(torch.ops, NAME).fused_add_rmsnorm.default._schema)
    assert schema == (f"{NAME}::fused_add_rmsnorm(Tensor(a0!) input, Tensor(a1!) residual, Tensor weight, "
                      f"float eps=9.9999999999999995e-07) -> ()")
    assert "(Tensor(a0!) out, Tensor x) -> ()" in str(getattr(torch.ops, NAME).silu_and_mul.default._schema)
    rotary = str(getattr(torch.ops, NAME).rotary_embedding_neox.default._schema)
    assert "(Tensor positions, Tensor(a1!) query, Tensor(a2!) key, Tensor cos_sin_cache) -> ()" in rotary


def _layer(pkg: Any):
    """A decoder-layer fragment calling the three ops the way a serving engine does."""
    def f(x, residual, w, positions, q, k, cache, gate_up):
        pkg.fused_add_rmsnorm(x, residual, w)
        pkg.rotary_embedding_neox(positions, q, k, cache)
        out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype, device=gate_up.device)
        pkg.silu_and_mul(out, gate_up)
        return x + 1, q * 2, k, out
    return f


def _inputs(device: str, tokens: int = 5) -> tuple[torch.Tensor, ...]:
    bf = torch.bfloat16
    return (torch.empty(tokens, 64, dtype=bf, device=device), torch.empty(tokens, 64, dtype=bf, device=device),
            torch.empty(64, dtype=bf, device=device), torch.empty(tokens, dtype=torch.int64, device=device),
            torch.empty(tokens, 4, 32, dtype=bf, device=device), torch.empty(tokens, 2, 32, dtype=bf, device=device),
            torch.empty(128, 32, dtype=torch.float32, device=device),
            torch.empty(tokens, 2 * 48, dtype=bf, device=device))


@pytest.mark.parametrize("backend", ["capture", "aot_eager"])
def test_ops_trace_under_torch_compile_with_no_graph_break(pkg: Any, backend: str):
    graphs = []

    def capture(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(_layer(pkg), fullgraph=True, backend=capture if backend == "capture" else backend)
    outs = compiled(*_inputs("meta"))
    assert [tuple(o.shape) for o in outs] == [(5, 64), (5, 4, 32), (5, 2, 32), (5, 48)]
    if graphs:
        code = graphs[0].code
        assert all(f"{NAME}.{k}" in code for k in MODEL_KERNELS), code


def test_ops_trace_with_fake_cuda_tensors(pkg: Any):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        inputs = _inputs("cuda")
        graph = make_fx(_layer(pkg), tracing_mode="fake")(*inputs)
    targets = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert {f"{NAME}.{k}.default" for k in MODEL_KERNELS} <= targets


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda p: p.silu_and_mul(_meta(4, 8), _meta(4, 18)), "ShapeError", "expected [num_tokens, 2*d]"),
    (lambda p: p.silu_and_mul(_meta(4, 12), _meta(4, 24)), "ShapeError", "not a multiple of 8"),
    (lambda p: p.silu_and_mul(_meta(0, 8), _meta(0, 16)), "ShapeError", "below its minimum 1"),
    (lambda p: p.silu_and_mul(_meta(4, 8), _meta(4, 16, 1)), "ShapeError", "must be 2-D"),
    (lambda p: p.silu_and_mul(_meta(4, 8, dtype=torch.float16), _meta(4, 16)), "DtypeError", "share one dtype"),
    (lambda p: p.silu_and_mul(_meta(4, 8, dtype=torch.float32), _meta(4, 16, dtype=torch.float32)),
     "DtypeError", "shipped for bfloat16, float16"),
    (lambda p: p.fused_add_rmsnorm(_meta(4, 64), _meta(4, 64), _meta(64, dtype=torch.float16)),
     "DtypeError", "share one dtype"),
    (lambda p: p.rotary_embedding_neox(_meta(5, dtype=torch.int32), _meta(5, 4, 32), _meta(5, 2, 32),
                                       _meta(128, 32, dtype=torch.float32)), "DtypeError", "positions must be int64"),
    (lambda p: p.rotary_embedding_neox(_meta(5, dtype=torch.int64), _meta(5, 4, 32), _meta(6, 2, 32),
                                       _meta(128, 32, dtype=torch.float32)), "ShapeError", "key has shape [6, 2, 32]"),
    (lambda p: p.fused_add_rmsnorm(_meta(64, 4).t(), _meta(4, 64), _meta(64)), "LayoutError", "contiguous"),
    (lambda p: p.silu_and_mul(torch.empty(4, 8, dtype=torch.bfloat16), torch.empty(4, 16, dtype=torch.bfloat16)),
     "LayoutError", "CUDA devices only"),
])
def test_argument_checks_raise_the_documented_errors(pkg: Any, call: Any, error: str, words: str):
    with pytest.raises(getattr(pkg, error)) as info:
        call(pkg)
    assert isinstance(info.value, pkg.ArgumentError) and isinstance(info.value, ValueError)
    assert words in str(info.value) and "\n" not in str(info.value)


def _silu_signature(pkg: Any) -> Any:
    checks = sys.modules[f"{NAME}._checks"]
    entry = pkg.MANIFEST["kernels"]["silu_and_mul"]
    return checks.Signature("silu_and_mul", [checks.ArgInfo.from_dict(a) for a in entry["args"]],
                            {n: [checks.DimRule.from_dict(r) for r in rs] for n, rs in entry["dims"].items()},
                            ["bfloat16"], 16)


def test_pointer_checks_refuse_misaligned_and_overlapping_tensors(pkg: Any):
    sig = _silu_signature(pkg)
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    assert sig.check({"out": torch.zeros(4, 8, dtype=torch.bfloat16), "x": x}, pointers=True) == (
        "bfloat16", {"num_tokens": 4, "d": 8})
    shifted = torch.zeros(4 * 8 + 1, dtype=torch.bfloat16)[1:].view(4, 8)  # 2 bytes past an aligned start
    with pytest.raises(pkg.LayoutError, match="not 16-byte aligned"):
        sig.check({"out": shifted, "x": x}, pointers=True)
    with pytest.raises(pkg.LayoutError, match="out overlaps x"):
        sig.check({"out": x.view(-1)[:32].view(4, 8), "x": x}, pointers=True)


def test_load_without_a_cuda_device_raises_a_ship_error_in_one_line(pkg: Any, monkeypatch: Any):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(pkg.DeviceError) as info:
        pkg.load()
    assert isinstance(info.value, pkg.ShipError)
    assert str(info.value).startswith("no CUDA device: torch ") and "sm_90" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_foreign_architecture_is_refused_in_one_line_before_anything_loads(pkg: Any, monkeypatch: Any):
    runtime_mod = sys.modules[f"{NAME}._runtime"]
    runtime = runtime_mod.Runtime(NAME, "sm_90", "13.0", {("silu_and_mul", "bfloat16"): Path("/nonexistent")})
    monkeypatch.setattr(runtime_mod, "device_arch", lambda index: "sm_80")
    monkeypatch.setattr(runtime_mod.torch.cuda, "get_device_name", lambda index: "NVIDIA A100")
    monkeypatch.setattr(runtime_mod, "_driver", lambda: pytest.fail("the driver was touched"))
    with pytest.raises(pkg.ArchitectureError) as info:
        runtime.function("silu_and_mul", "bfloat16", 0)
    message = str(info.value)
    assert "\n" not in message and "sm_90" in message and "sm_80" in message and "cuda:0 (NVIDIA A100)" in message


class _FakeDriver:
    """Just enough of cuda.bindings.driver to watch the runtime's calls."""

    SUCCESS = 0

    def __init__(self) -> None:
        self.CUresult = SimpleNamespace(CUDA_SUCCESS=0)
        self.CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_RELAXED="relaxed")
        self.CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="max_smem")
        self.calls: list[tuple[Any, ...]] = []
        self.capture_mode = "global"
        self.current = 0
        self.launched: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> tuple[Any, ...]:
            self.calls.append((name, *args))
            return (0, *self._result(name, args))
        return call

    def _result(self, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if name == "cuThreadExchangeStreamCaptureMode":
            previous, self.capture_mode = self.capture_mode, args[0]
            return (previous,)
        if name == "cuCtxGetCurrent":
            return (self.current,)
        if name == "cuCtxSetCurrent":
            self.current = args[0]
        if name == "cuLaunchKernel":
            self.launched.append(_read_params(args[9], 5))
        return {"cuDeviceGet": (3,), "cuDevicePrimaryCtxRetain": (77,), "cuModuleLoadData": ("module",),
                "cuModuleGetFunction": ("function",)}.get(name, ())

    def CUstream(self, handle: int) -> int:  # noqa: N802 (the binding's name)
        return handle


def _read_params(address: int, count: int) -> list[Any]:
    """The kernel arguments behind a void** array: two pointers, two ints, one float."""
    slots = (ctypes.c_void_p * count).from_address(address)
    types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_float)
    return [t.from_address(slots[i]).value for i, t in enumerate(types)]


def test_the_runtime_loads_in_relaxed_capture_mode_and_packs_the_c_arguments(pkg: Any, shipped: Path,
                                                                             monkeypatch: Any):
    runtime_mod = sys.modules[f"{NAME}._runtime"]
    driver = _FakeDriver()
    monkeypatch.setattr(runtime_mod, "_driver", lambda: driver)
    monkeypatch.setattr(runtime_mod, "device_arch", lambda index: "sm_90")
    monkeypatch.setattr(runtime_mod.torch.cuda, "get_device_name", lambda index: "NVIDIA H200")
    cubin = shipped / NAME / "cubins" / "silu_and_mul.bfloat16.cubin"
    runtime = runtime_mod.Runtime(NAME, "sm_90", "13.0", {("silu_and_mul", "bfloat16", 0): cubin})
    loaded = runtime.function("silu_and_mul", "bfloat16", 0)
    assert runtime.function("silu_and_mul", "bfloat16", 0) is loaded  # loaded once per device
    names = [c[0] for c in driver.calls]
    assert names.index("cuThreadExchangeStreamCaptureMode") < names.index("cuModuleLoadData")
    assert driver.capture_mode == "global"  # restored after loading
    assert ("cuModuleGetFunction", "module", b"silu_and_mul") in driver.calls
    runtime.launch(loaded, "silu_and_mul", (7, 1, 1), (128, 1, 1), 64 * 1024,
                   ["tensor", "tensor", "int", "int", "float"], [0x7000, 0x9000, 4, 8, 0.5], 1234)
    assert driver.launched == [[0x7000, 0x9000, 4, 8, 0.5]]
    launch = next(c for c in driver.calls if c[0] == "cuLaunchKernel")
    assert launch[1:10] == ("function", 7, 1, 1, 128, 1, 1, 64 * 1024, 1234)
    assert ("cuFuncSetAttribute", "function", "max_smem", 64 * 1024) in driver.calls
    assert driver.current == 77  # launched in the device's primary context


def test_dimension_rules_are_read_off_the_specs():
    rules = derive_dims(load_kernel("silu_and_mul"))
    assert [r.text() for r in rules["x"]] == ["num_tokens", "2*d"]
    rotary = derive_dims(load_kernel("rotary_embedding_neox"))
    assert [r.text() for r in rotary["cos_sin_cache"]] == ["max_position", "rot_dim"]
    with pytest.raises(DimsError, match="cannot tell renormalize"):
        derive_dims(load_kernel("topk_softmax"))


def test_two_winners_for_one_kernel_and_dtype_are_refused(runs: list[Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]):
    assert ship.main([str(runs[0]), str(runs[0]), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "ship one of the two runs" in err and err.count("\n") == 1


def test_another_architecture_ships_as_a_fresh_compile(runs: list[Path], tmp_path: Path):
    assert ship.main([str(runs[1]), "--out", str(tmp_path), "--name", "other_arch", "--arch", "sm_80"]) == 0
    manifest = json.loads((tmp_path / "other_arch" / "manifest.json").read_text())
    build = manifest["kernels"]["silu_and_mul"]["builds"]["float16"]
    assert manifest["arch"] == "sm_80" and build["binary_as_evaluated"] is False


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_the_benchmark_decoder_runs_in_torch_and_traces_with_the_shipped_ops(pkg: Any, decode: bool):
    from experiments.model_decoder import (
        ModelShape,
        ShippedOps,
        StepInputs,
        TorchOps,
        make_inputs,
        make_weights,
        step,
    )

    shape = ModelShape(hidden=64, heads=4, kv_heads=2, head_dim=32, intermediate=96, layers=2, max_position=128)
    layers, cos_sin = make_weights(shape, torch.float32, "cpu")
    inp = make_inputs(shape, 3, 16, decode, torch.float32, "cpu")
    x, residual = step(TorchOps(), layers, cos_sin, inp, shape)
    assert x.shape == residual.shape == (3, 64) and bool(x.isfinite().all())
    meta_layers = [type(w)(*(t.to("meta", torch.bfloat16) for t in vars(w).values())) for w in layers]
    def meta(t: torch.Tensor) -> torch.Tensor:
        return t.to("meta", torch.bfloat16 if t.is_floating_point() else t.dtype)

    meta_inp = StepInputs(meta(inp.x), meta(inp.residual), meta(inp.positions),
                          [(meta(k), meta(v)) for k, v in inp.caches])
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out = compiled(ShippedOps(pkg), meta_layers, cos_sin.to("meta"), meta_inp, shape)
    assert [tuple(t.shape) for t in out] == [(3, 64), (3, 64)]


def test_kernels_dispatched_by_shape_ship_with_the_runs_table(tmp_path: Path):
    """A run whose result holds several kernels (search.dispatch) ships every one of them, and
    the package launches on each shape the kernel the run's table gives it."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "search.run", "--evaluator", "standin", "--kernel", "silu_and_mul", "--agent",
           "tests.unit.search_toy_agent:ToyAgent", "--population", "3", "--rounds", "2", "--variants", "3",
           "--trials", "3", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    best = json.loads((run_dir / "best" / "silu_and_mul.json").read_text())
    assert len(best["dispatch"]["members"]) >= 2, "the toy run's stand-in times favour a second kernel somewhere"
    name = "ship_dispatch_ops"
    assert ship.main([str(run_dir), "--out", str(tmp_path / "pkg"), "--name", name]) == 0
    pkg_dir = tmp_path / "pkg" / name
    manifest = json.loads((pkg_dir / "manifest.json").read_text())
    build = manifest["kernels"]["silu_and_mul"]["builds"]["float16"]
    members = best["dispatch"]["members"]
    assert [m["variant_id"] for m in build["members"]] == [m["variant"]["id"] for m in members[1:]]
    assert all((pkg_dir / m["cubin"]).is_file() and m["binary_as_evaluated"] for m in build["members"])
    assert (pkg_dir / "_dispatch.py").read_bytes() == (ROOT / "kernels" / "dispatch_rule.py").read_bytes()
    sys.path.insert(0, str(tmp_path / "pkg"))
    try:
        ops_mod = importlib.import_module(f"{name}._ops")
        plans = ops_mod.LaunchPlans("silu_and_mul", manifest["kernels"]["silu_and_mul"]["builds"], pkg_dir)
        table = best["dispatch"]["table"]
        from kernels.spec import shape_label

        for shape in best["dispatch"]["search_shapes"]:
            assert plans.member("float16", shape) == table[shape_label(shape)]
            member, cfg = plans.resolve("float16", shape)
            assert member == table[shape_label(shape)] and cfg.grid[0] >= 1
        # Any other shape: the member of the nearest search shape, as the run's held-out check used.
        from search.dispatch import Dispatch

        for shape in best["heldout_shapes"]:
            labels = [shape_label(s) for s in best["dispatch"]["search_shapes"]]
            expected = Dispatch.member_for(SimpleNamespace(  # type: ignore[arg-type]
                table=table, shapes=tuple(best["dispatch"]["search_shapes"])), shape)
            assert plans.member("float16", shape) == expected, (shape, labels)
    finally:
        sys.path.remove(str(tmp_path / "pkg"))
