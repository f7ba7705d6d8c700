"""``python -m search.run``: search for faster kernels with a population of agents on Ray.

Examples::

    python -m search.run --population 8 --rounds 5
    python -m search.run --kernel silu_and_mul --dtype bfloat16 --agent llm --model o4-mini
    python -m search.run --evaluator standin --rounds 2      # CPU dry run, numbers not real
    python -m search.run --resume runs/20261129-101500-ab12

With ``--agent llm`` the endpoint is checked before anything starts (a wrong URL, key or
model exits 2 within seconds), and the tester proposes extra search shapes once per kernel;
they are recorded in ``extra_shapes.json`` and reused when the run is resumed. Held-out
shapes are drawn once per kernel from the run's seed (``heldout_shapes.json``).

Resuming a finished run (its ``summary.json`` is written last) evaluates and rewrites
nothing: it prints the summary on record.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shlex
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from agents.base import derive_seed
from agents.factory import AgentConfigError, make_agent
from kernels.check import preflight
from kernels.folders import KernelRef
from kernels.records import atomic_write, read_jsonl
from kernels.spec import KernelSpec, KernelSpecError, kernel_ref, list_kernels, load_kernel
from search.config import ConfigError, RunConfig, dump_config, load_config, override
from search.outcome import never_admitted
from search.records import RunRecords

if TYPE_CHECKING:
    from search.cluster import Staged

REPO_ROOT = Path(__file__).resolve().parent.parent
EXTRA_SHAPES_FILE = "extra_shapes.json"
HELDOUT_SHAPES_FILE = "heldout_shapes.json"
SUMMARY_FILE = "summary.json"
CLUSTER_FILE = "cluster.json"
KERNELS_FILE = "kernels.json"


class UsageError(ValueError):
    """A run that cannot start as asked (missing GPU, bad resume directory, ...)."""


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad arguments exit 2 with one line, no usage dump: scripts and people read the reason,
    not the synopsis."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def add_search_options(p: argparse.ArgumentParser) -> None:
    """The options ``search.run`` and ``search.sweep`` share."""
    p.add_argument("--config", help="YAML config file (command-line options override it)")
    p.add_argument("--population", type=int, help="agent actors, one lineage each")
    p.add_argument("--variants", type=int, help="proposals per agent per round")
    p.add_argument("--trials", type=int, help="Optuna trials per tunable variant")
    p.add_argument("--dispatch", type=int, help="most kernels in a result, each run on the shapes where it was "
                                                 "fastest (1: one kernel for every shape)")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--gpus", type=int, help="evaluator actors (default: every GPU of the cluster)")
    p.add_argument("--address", help="address of an existing Ray cluster")
    p.add_argument("--agent", help="embedded, llm, or module:Class")
    p.add_argument("--model", help="model name for --agent llm")
    p.add_argument("--evaluator", choices=("gpu", "standin"), help="standin: CPU test double, never for reported numbers")
    p.add_argument("--seed", type=int)
    p.add_argument("--compile-ahead", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the end-of-run loops' torch.compile programs ahead of them, once per kernel "
                        "and shape set, every round's loop loading them (default on); off: every loop compiles "
                        "afresh")
    p.add_argument("--compile-beside-search", action=argparse.BooleanOptionalAction, default=None,
                   help="with --compile-ahead, make those compilations from the run's start, beside the search "
                        "(default on); off: once every final timing is in")
    p.add_argument("--peers-beside-search", action=argparse.BooleanOptionalAction, default=None,
                   help="with --compile-beside-search, set the peers' loops up beside the search and time them "
                        "once it is over (default on): the end-of-run loops then time our kernels and the "
                        "baseline alone; off: they time the peers")
    p.add_argument("--overlap-rounds", action=argparse.BooleanOptionalAction, default=None,
                   help="set the end-of-run rounds of loops up beside each other, each timing with the GPU "
                        "alone (default on); off: one round at a time")
    p.add_argument("--fresh-peers", action="store_true", default=None,
                   help="time every production peer afresh instead of reusing its cached figures")
    p.add_argument("--peer-cache", metavar="DIR", dest="peer_cache_dir", help="folder of the peer-timing cache "
                                                       "(default ~/.cache/kernel-search/peer-times)")
    p.add_argument("--no-peer-cache", action="store_false", dest="use_peer_cache", default=None,
                   help="neither read nor write the peer-timing cache")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m search.run", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", action="append", dest="kernels", help="library kernel name (repeatable)")
    p.add_argument("--kernel-dir", help="folder of kernel folders to optimise instead of the library")
    p.add_argument("--rounds", type=int, help="search rounds")
    add_search_options(p)
    p.add_argument("--out", help="parent folder of run directories (default runs/)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a killed run")
    return p


def resolve_config(args: argparse.Namespace) -> RunConfig:
    """The file (or the resumed run's config), then the command-line overrides."""
    if args.resume is not None:
        saved = args.resume / "config.yaml"
        if not saved.is_file():
            raise UsageError(f"--resume {args.resume}: no config.yaml there (not a run directory)")
        config = load_config(saved)
    else:
        config = load_config(args.config)
    return override(config, {
        "kernels": tuple(args.kernels) if args.kernels else None, "kernel_dir": args.kernel_dir,
        "dtype": args.dtype, "out": args.out, "seed": args.seed, "address": args.address,
        "search.population": args.population, "search.rounds": args.rounds, "search.variants": args.variants,
        "search.trials": args.trials, "search.dispatch": args.dispatch, "agent.kind": args.agent, "agent.model": args.model,
        "evaluator.kind": args.evaluator, "evaluator.gpus": args.gpus, "evaluator.compile_ahead": args.compile_ahead,
        **peer_overrides(args),
    })


def peer_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The peer-cache options of :func:`add_search_options` as config overrides."""
    return {"evaluator.fresh_peers": args.fresh_peers, "evaluator.peer_cache_dir": args.peer_cache_dir,
            "evaluator.peer_cache": args.use_peer_cache, "evaluator.overlap_rounds": args.overlap_rounds,
            "evaluator.compile_beside_search": args.compile_beside_search,
            "evaluator.peers_beside_search": args.peers_beside_search}


def resolve_kernels(config: RunConfig) -> list[tuple[KernelSpec, KernelRef]]:
    """(spec, reference) per kernel of the run; checks the dtype fits.

    The reference (folder, digest of its files, name) is how every process of the run finds
    the kernel; its name is what records and run files call it: the spec's name, or
    ``name@digest-prefix`` for kernels whose names meet in one run (two libraries).

    Raises:
        UsageError: a ``--kernel-dir`` without kernel folders, or one kernel folder twice.
        KernelSpecError: a kernel that cannot be loaded.
        ConfigError: a kernel without the run's dtype.
    """
    if config.kernel_dir:
        folder = Path(config.kernel_dir)
        if not folder.is_dir():
            raise UsageError(f"--kernel-dir {folder} is not a folder")
        given = [str((folder / n).resolve()) for n in list_kernels(folder)]
        if not given:
            raise UsageError(f"--kernel-dir {folder} holds no kernel folders (NAME/spec.py)")
    else:
        given = list(config.kernels)
    loaded = []
    for text in given:
        ref = kernel_ref(text)
        spec = load_kernel(ref)
        if config.dtype not in spec.dtypes:
            raise ConfigError(f"kernel {spec.name} supports {', '.join(spec.dtypes)}, not {config.dtype}")
        loaded.append((spec, ref))
    return name_kernels(loaded)


def name_kernels(loaded: Sequence[tuple[KernelSpec, KernelRef]]) -> list[tuple[KernelSpec, KernelRef]]:
    """Gives each kernel its name in the run: the spec's, unless another kernel of the run
    has it too; then ``name@`` and the first 8 digits of the folder's digest.

    Raises:
        UsageError: two of the folders hold the same files (the same kernel twice).
    """
    by_digest: dict[str, str] = {}
    for _, ref in loaded:
        if ref.digest in by_digest:
            raise UsageError(f"kernel folders {by_digest[ref.digest]} and {ref.folder} hold the same files; "
                             "give each kernel once")
        by_digest[ref.digest] = ref.folder
    counts = Counter(spec.name for spec, _ in loaded)
    return [(spec, ref.renamed(spec.name if counts[spec.name] == 1 else f"{spec.name}@{ref.digest[:8]}"))
            for spec, ref in loaded]


def check_recorded_kernels(run_dir: Path, kernels: Sequence[tuple[KernelSpec, KernelRef]]) -> None:
    """Records the run's kernel references in ``kernels.json``; a resumed run must find the
    same folders with the same files (records of one kernel never continue on another).

    Raises:
        UsageError: a kernel of the resumed run changed (files, or which kernels the run has).
    """
    path = run_dir / KERNELS_FILE
    now = {ref.name: ref.to_dict() for _, ref in kernels}
    if path.is_file():
        before = json.loads(path.read_text())
        changed = sorted(set(before) ^ set(now)) + sorted(
            n for n in set(before) & set(now) if before[n]["digest"] != now[n]["digest"])
        if changed:
            n = changed[0]
            was = f"digest {before[n]['digest']}" if n in before else "not in the run"
            is_ = f"digest {now[n]['digest']} in {now[n]['folder']}" if n in now else "not given now"
            raise UsageError(f"kernel {n} changed since the run started ({was}, now {is_}); "
                             "resume it with the kernel folders it started with, or start a new run")
    atomic_write(path, json.dumps(now, indent=2))


def check_local_gpu(config: RunConfig) -> None:
    if config.evaluator.kind != "gpu" or config.address:
        return
    import torch

    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU visible; run on a GPU machine, join a cluster with --address, "
                         "or dry-run with --evaluator standin")


def worker_runtime_env() -> dict[str, Any]:
    """Ray's runtime_env for a local cluster: its workers share this machine's disk, so they
    import this repository's packages where they are (before the caller's own PYTHONPATH) and
    read kernel folders at their paths. A cluster gets :func:`search.cluster.runtime_env`."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {"env_vars": {"PYTHONPATH": path}}


# Ray (2.5x and later) turns token authentication on for every local cluster it starts and
# logs so, as a warning, on every start. The notice is only about its own default, which
# stays as it is: setting RAY_AUTH_MODE ourselves to silence it changed what later clusters in
# the same process expected (in-process test clusters failed to start with InvalidAuthToken),
# so the one log line is filtered instead; Ray's other authentication messages still show.
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
RAY_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"


class RayAuthNoticeFilter(logging.Filter):
    """Drops Ray's notice that it enabled token authentication by default (nothing else)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(RAY_AUTH_NOTICE)


def quiet_ray_auth_notice() -> None:
    """Installs :class:`RayAuthNoticeFilter` on Ray's authentication logger, once."""
    logger = logging.getLogger(RAY_AUTH_LOGGER)
    if not any(isinstance(f, RayAuthNoticeFilter) for f in logger.filters):
        logger.addFilter(RayAuthNoticeFilter())


def start_ray(config: RunConfig, kernels: Sequence[KernelRef] = ()) -> Staged | None:
    """Starts a local Ray cluster, or joins ``config.address`` with the project's packages and
    the ``kernels``' folders shipped in the job's runtime environment; returns what was shipped
    (None for a local cluster, or when Ray was already started by the caller). On a cluster,
    compile tasks go to its CPU-only nodes (:class:`search.pool.AdmissionTasks`); elsewhere
    Ray places them.

    Raises:
        UsageError: the code and kernel folders cannot be shipped.
    """
    import ray

    from search.pool import admission_task

    if ray.is_initialized():
        admission_task.anywhere()
        return None
    if not config.address:
        ray.init(include_dashboard=False, runtime_env=worker_runtime_env(), log_to_driver=False)
        admission_task.anywhere()
        return None
    from search.cluster import StagingError, UnreachableCluster, check_reachable, runtime_env, stage

    try:
        check_reachable(config.address)
    except UnreachableCluster as exc:
        raise UsageError(str(exc)) from None
    # ray.init zips and uploads the working_dir before it returns, so the staged copy is only
    # needed until then.
    with tempfile.TemporaryDirectory(prefix="ksearch-stage-") as tmp:
        try:
            staged = stage(kernels, Path(tmp) / "job")
        except StagingError as exc:
            raise UsageError(str(exc)) from None
        ray.init(address=config.address, runtime_env=runtime_env(staged))
    # Chosen once per run from the cluster's nodes (refreshed if they change): compile tasks go
    # to its CPU-only nodes where it has some, away from the evaluators' GPU nodes.
    admission_task.on_cpu_nodes()
    return staged


def start_peer_warmup(config: RunConfig, prep: Prepared, skip: Sequence[str] = ()) -> Any:
    """Starts compiling the peers (torch.compile, FlashInfer JIT) in the background, so the
    end-of-run peer timing finds them in the on-disk caches instead of idling the GPU; not for
    the kernels named in ``skip`` (their peers' figures are all in the peer cache).

    Only for GPU runs on a local Ray cluster: on a cluster the final evaluator may land on a
    node whose caches these processes never touch.
    """
    if config.evaluator.kind != "gpu" or not config.evaluator.peers or config.address:
        return None
    from evaluators.peer_warmup import PeerWarmup

    kernels = [ref for _, ref in prep.kernels if ref.name not in skip]
    if not kernels:
        print("peers: every loop's peer figures are in the peer cache; nothing to compile ahead", flush=True)
        return None
    processes = max(1, min(4, (os.cpu_count() or 2) // 4))
    return PeerWarmup(kernels, config.dtype, prep.run_dir, processes)


def evaluator_count(config: RunConfig) -> int:
    import ray

    if config.evaluator.kind == "standin":
        return config.evaluator.gpus or 1
    available = int(ray.cluster_resources().get("GPU", 0))
    if available == 0:
        raise UsageError("the Ray cluster has no GPU; use --evaluator standin for a dry run")
    wanted = config.evaluator.gpus or available
    if wanted > available:
        raise UsageError(f"--gpus {wanted} but the Ray cluster has {available} GPU(s)")
    return wanted


def write_placement(run_dir: Path, staged: Staged, where: list[list[Any]]) -> None:
    """``cluster.json``: the cluster's nodes, what was shipped to them, where each evaluator
    and agent actor ran and took the project and the kernel folders from, and the nodes the
    compile tasks were sent to and ran on."""
    import ray
    from ray.exceptions import RayError

    from search.cluster import placement_record
    from search.pool import admission_task

    def answer(ref: Any) -> dict[str, Any]:
        try:  # answered long ago unless the actor died (then replaced): say so, the run goes on
            return dict(ray.get(ref, timeout=60))
        except (RayError, TimeoutError) as exc:
            return {"error": " ".join(str(exc).split())[:300]}

    evaluators, agents = ([answer(ref) for ref in refs] for refs in where)
    record = placement_record(staged, evaluators, agents, admission_task.record())
    atomic_write(run_dir / CLUSTER_FILE, json.dumps(record, indent=2))


@dataclass
class Prepared:
    """A run ready to start: its config, kernels and directory."""

    config: RunConfig
    kernels: list[tuple[KernelSpec, KernelRef]]
    run_dir: Path
    resume: bool


def check_agent(config: RunConfig) -> None:
    """Builds one agent so that a missing backend fails now; for ``llm`` also checks, in
    seconds and before Ray starts, that the endpoint answers, takes the key and serves the model.

    Raises:
        AgentConfigError: the backend cannot be imported or built.
        UsageError: a bad ``llm`` setting or an unusable endpoint.
    """
    if config.agent.kind != "llm":
        make_agent(config.agent.kind, config.agent, config.seed)
        return
    try:
        from agents.llm import LLMConfigError, PreflightError
    except ImportError as exc:
        raise AgentConfigError(f"the LLM agent backend cannot be imported: {exc}") from None
    try:
        make_agent("llm", config.agent, config.seed).preflight()  # type: ignore[attr-defined]
    except (LLMConfigError, PreflightError) as exc:
        raise UsageError(f"LLM endpoint check failed: {exc}") from None


def recorded_extra_shapes(run_dir: Path) -> dict[str, list[dict[str, int]]]:
    """Extra shapes an earlier attempt at this run already got from the tester, per kernel.

    ``extra_shapes.json`` first; the tester's call records in ``llm_calls.jsonl`` fill in
    kernels whose answer was recorded before a kill cut the run short of writing the file.
    """
    path = run_dir / EXTRA_SHAPES_FILE
    shapes: dict[str, list[dict[str, int]]] = json.loads(path.read_text()) if path.is_file() else {}
    for call in read_jsonl(run_dir / "llm_calls.jsonl"):
        if call.get("role") == "tester" and call.get("kernel") not in shapes:
            shapes[call["kernel"]] = list(call.get("accepted_shapes") or [])
    return shapes


def tester_shapes(prep: Prepared, records: RunRecords) -> dict[str, list[dict[str, int]]]:
    """Extra search shapes per kernel from the LLM tester, asked once per kernel and run.

    A resumed run reuses what was recorded and asks only about kernels without a record, so
    every evaluation of the run, before and after a resume, uses the same shapes. The tester's
    calls go to ``llm_calls.jsonl``; the shapes to ``extra_shapes.json``.
    """
    cfg = prep.config
    if cfg.agent.kind != "llm":
        return {}
    shapes = recorded_extra_shapes(prep.run_dir) if prep.resume else {}
    missing = [(spec, ref) for spec, ref in prep.kernels if ref.name not in shapes]
    if missing:
        tester: Any = make_agent("llm", cfg.agent, cfg.seed)
        _ = tester.client  # built once here: the threads below share it
        with ThreadPoolExecutor(max_workers=min(len(missing), tester.config.concurrency)) as pool:
            answers = list(pool.map(lambda k: tester.propose_shapes(k[0], k[1].name), missing))
        for call in tester.tester_calls:
            records.append("llm_calls", {**call, "variant_id": "", "run_id": records.run_id})
        shapes.update({ref.name: answer for (_, ref), answer in zip(missing, answers, strict=True)})
    atomic_write(prep.run_dir / EXTRA_SHAPES_FILE, json.dumps(shapes, indent=2))
    return shapes


def drawn_heldout_shapes(prep: Prepared) -> dict[str, list[dict[str, int]]]:
    """Held-out shapes drawn for this run per kernel (:meth:`KernelSpec.draw_heldout`), from
    the run's seed and the kernel's name; recorded in ``heldout_shapes.json`` and read back
    on resume, so that every held-out check of the run uses the same shapes."""
    path = prep.run_dir / HELDOUT_SHAPES_FILE
    shapes: dict[str, list[dict[str, int]]] = json.loads(path.read_text()) if path.is_file() else {}
    missing = [(spec, ref.name) for spec, ref in prep.kernels if ref.name not in shapes]
    for spec, name in missing:
        shapes[name] = [dict(s) for s in spec.draw_heldout(derive_seed(prep.config.seed, name, "heldout"))]
    if missing or not path.is_file():
        atomic_write(path, json.dumps(shapes, indent=2))
    return shapes


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run that finished (written last), or None."""
    path = run_dir / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def checked_kernels(config: RunConfig) -> list[tuple[KernelSpec, KernelRef]]:
    """The run's kernels (:func:`resolve_kernels`) once everything a run or sweep checks before
    it starts holds: the kernels pass ``kernels.check`` at the run's dtype (a broken kernel
    folder: one line, before Ray), the agent can be built and a GPU run has a GPU.

    Raises:
        UsageError, ConfigError, KernelSpecError, KernelCheckError, AgentConfigError: the run
            cannot start as asked.
    """
    kernels = resolve_kernels(config)
    preflight((spec for spec, _ in kernels), config.dtype, cpu=config.evaluator.kind == "standin")
    check_agent(config)
    check_local_gpu(config)
    return kernels


def prepare(args: argparse.Namespace) -> Prepared:
    config = resolve_config(args)
    kernels = checked_kernels(config)
    if args.resume is not None:
        run_dir = args.resume
    else:
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
        run_dir = Path(config.out) / run_id
        run_dir.mkdir(parents=True, exist_ok=False)
    return Prepared(config, kernels, run_dir, args.resume is not None)


def run_search(prep: Prepared, command: str, progress_cls: Any = None) -> dict[str, Any]:
    """Runs (or resumes) the search, then finalizes and reports; returns the summary.

    ``progress_cls`` replaces :class:`search.progress.Progress` (same constructor), e.g. the
    sweep's per-library progress line. A resumed run that had finished is only reported.
    """
    from search.report import print_summary
    from search.run_report import write_run_report

    done = finished_summary(prep.run_dir) if prep.resume else None
    if done is not None:
        print_summary(done)
        print(f"\nrun directory: {prep.run_dir} (finished before; nothing evaluated again)")
        return done
    summary = _search(prep, command, progress_cls)
    print_summary(summary)
    report = write_run_report(prep.run_dir, summary, print_summary)
    print(f"\nrun directory: {prep.run_dir} (report: {report.name})")
    return summary


def _search(prep: Prepared, command: str, progress_cls: Any) -> dict[str, Any]:
    import ray

    from search.compile_ahead import CompiledAhead, needed, room, rounds_beside
    from search.controller import Controller
    from search.finalize import all_cached, finalize, open_peer_cache
    from search.pool import AgentActor, EvalPool
    from search.progress import Progress, busy_fraction
    from search.records import AttemptClock, load_history
    from search.report import build_summary, write_tables
    from search.stages import StageClock
    from search.state import KernelState
    from search.tuning import JOURNAL, TuningStore

    cfg = prep.config
    stages = StageClock()  # set-up: Ray, the records, the evaluators' start (not the imports before)
    check_recorded_kernels(prep.run_dir, prep.kernels)
    clock = AttemptClock(prep.run_dir)
    dump_config(cfg, prep.run_dir / "config.yaml")
    history = load_history(prep.run_dir) if prep.resume else None
    records = RunRecords(prep.run_dir, prep.run_dir.name)
    try:
        extra = tester_shapes(prep, records)
        heldout = drawn_heldout_shapes(prep)
        quiet_ray_auth_notice()
        staged = start_ray(cfg, [ref for _, ref in prep.kernels])
        n_gpus = evaluator_count(cfg)
    except BaseException:
        records.close()
        raise
    states = [KernelState(spec, ref, cfg.dtype, cfg.search.population, cfg.search.top_k, cfg.search.migrate_every,
                          tuple(extra.get(ref.name, ())), tuple(heldout.get(ref.name, ())))
              for spec, ref in prep.kernels]
    actor_cls = ray.remote(AgentActor).options(num_cpus=0)
    # Member i's own seed: fixed by the run's seed and its slot (seeds i = 0..4 give the embedded
    # agents five different strategies).
    agents: list[Any] = [actor_cls.remote(cfg.agent.kind, cfg.agent, cfg.seed * 1000 + i)
                         for i in range(cfg.search.population)]
    # Room for the end-of-run loops' compilations beside the search (two shape sets per kernel
    # at most; search.compile_ahead), which take the place of the peers' warm-up.
    beside = room(2 * len(states)) if needed(cfg.evaluator, states, None) else 0
    if beside and rounds_beside(cfg.evaluator):
        # and for the peers' rounds set up beside the search (one process per kernel and round;
        # once set up, each only waits for the search to end)
        beside += cfg.evaluator.peer_runs * len(states)
    pool = EvalPool(cfg.evaluator.kind, n_gpus, cfg.evaluator.retries, cfg.evaluator.standin_latency_s, beside)
    # Peers whose figures are all kept from earlier runs need no compiling during this one.
    peer_cache = open_peer_cache(cfg.evaluator, pool)
    ahead = CompiledAhead(records.run_id, cfg.evaluator, peer_cache) if beside else None
    if ahead is not None:
        ahead.start(pool, needed(cfg.evaluator, states, peer_cache))
        warmup = None
    else:
        warmup = start_peer_warmup(cfg, prep, [st.name for st in states if all_cached(peer_cache, cfg.evaluator, st)])
    stages.add("set-up", time.time() - stages.started)
    progress = (progress_cls or Progress)(n_gpus=n_gpus, evaluator_kind=cfg.evaluator.kind)
    ctl = Controller(cfg, states, records, pool, agents, TuningStore(cfg.seed, prep.run_dir / JOURNAL), progress, history,
                     on_tick=partial(_tick, clock, pool))
    # Asked now (behind each actor's start), read after the search: no wait before it starts.
    where = None if staged is None else [[a.whereabouts.remote(staged.kernels) for a in actors]
                                         for actors in (pool.actors, agents)]
    try:
        with stages.stage("search"):
            ctl.run()
        if ahead is not None:
            ahead.open_gate()  # the peers' rounds set up beside the search time from now on
        if staged is not None and where is not None:
            write_placement(prep.run_dir, staged, where)
        progress.finish()
        results, device = finalize(ctl, warmup, peer_cache, stages, ahead)
    finally:
        clock.stop(pool.busy_s)
        if warmup is not None:
            warmup.stop()
        records.close()
        for actor in agents:
            ray.kill(actor)
    wall = clock.total_wall_s()
    meta = {"run_id": prep.run_dir.name, "command": command, "gpu": device, "evaluator": cfg.evaluator.kind,
            "n_gpus": n_gpus, "wall_s": wall, "gpu_busy_fraction": busy_fraction(clock.total_busy_s(), wall, n_gpus),
            "evaluator_actors_replaced": pool.replaced, "resumed": prep.resume, "attempts": len(clock.earlier) + 1,
            "extra_shapes": {st.name: list(st.extra_shapes) for st in states},
            "heldout_drawn_shapes": {st.name: list(st.heldout_extra) for st in states},
            "peer_cache": ({"folder": str(peer_cache.folder), "environment": peer_cache.environment}
                           if peer_cache is not None else None),
            "compiled_beside_search": ahead.summary() if ahead is not None else None}
    with stages.stage("report"):
        write_tables(prep.run_dir)
    # this attempt's stages (a resumed run's earlier attempts are not in them)
    meta.update(stage_s=dict(stages.seconds), end_calls_s=dict(stages.calls))
    return build_summary(prep.run_dir, results, meta)  # summary.json last: the run is finished


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        prep = prepare(args)
    except (ConfigError, KernelSpecError, AgentConfigError, UsageError, FileExistsError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    command = "python -m search.run " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    print(f"run directory: {prep.run_dir}", file=sys.stderr, flush=True)
    INTERRUPTS.install()
    try:
        summary = run_search(prep, command)
    except UsageError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        stop_ray_quietly()
        print(f"\n{interrupted_line(prep.run_dir)}", file=sys.stderr, flush=True)
        return 130
    failed = never_admitted(summary)
    if failed:
        print(f"error: no proposal was admitted for {', '.join(failed)}: the agents produced nothing that compiled "
              f"and ran (see the report above and {prep.run_dir / 'proposals.jsonl'})", file=sys.stderr)
        return 1
    return 0


class InterruptWatch:
    """Ctrl-C that cannot be lost. Python raises KeyboardInterrupt wherever the main thread
    happens to be; inside a finalizer or a logging lock release it is printed as "Exception
    ignored" and the run goes on as if nothing was pressed (seen under load). The handler also
    notes the interrupt, and :meth:`check`, called on every turn of the controller's loop,
    raises it again from there."""

    def __init__(self) -> None:
        self.seen = False

    def install(self) -> None:
        """Takes over SIGINT in this (the main) thread."""
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.seen = True
        if not swallowed_there(frame):
            raise KeyboardInterrupt

    def check(self) -> None:
        if self.seen:
            raise KeyboardInterrupt


def swallowed_there(frame: Any) -> bool:
    """Whether an exception raised in ``frame`` would be printed as "Exception ignored" with its
    traceback and dropped: a finalizer (``__del__``), or the logging module, whose lock release
    runs as an at-fork hook after every subprocess start. A Ctrl-C arriving there is only noted;
    :meth:`InterruptWatch.check` raises it on the controller's next turn."""
    if frame is None:
        return False
    name = str(frame.f_globals.get("__name__", ""))
    return frame.f_code.co_name == "__del__" or name == "logging" or name.startswith("logging.")


INTERRUPTS = InterruptWatch()  # installed by the command-line entry points only


def _tick(clock: Any, pool: Any) -> None:
    """On every turn of the controller's loop: the attempt's clock, then a Ctrl-C Python lost."""
    clock.tick(pool.busy_s)
    INTERRUPTS.check()


def stop_ray_quietly() -> None:
    """Shuts the local Ray down after Ctrl-C, which a terminal sends to Ray's own processes too:
    left to the exit handlers, their teardown of a half-stopped cluster prints tracebacks."""
    import ray

    try:
        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # the cluster is going away anyway; the run's records are already closed
        pass


def interrupted_line(run_dir: Path) -> str:
    """The one line an interrupted run leaves: how to continue it (every finished evaluation
    is on disk and is not run again), or that nothing had started."""
    if not (run_dir / "config.yaml").is_file():
        return f"interrupted before the search started; nothing to resume in {run_dir}"
    return f"interrupted; continue with: python -m search.run --resume {shlex.quote(str(run_dir))}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":
    raise SystemExit(main())
