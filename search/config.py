"""Run configuration: nested dataclasses, loaded from YAML, validated, overridable from the CLI.

The resolved configuration is written into every run directory (``config.yaml``) so that a
run can be reproduced and resumed from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_KERNELS = ("silu_and_mul", "fused_add_rmsnorm", "merge_attn_states_lse")
DTYPES = ("float16", "bfloat16", "float32")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the field and the fix."""


def _positive(section: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{section}.{name} must be a positive integer, got {value!r}")


@dataclass
class SearchConfig:
    """How wide and how long to search.

    Attributes:
        population: agent actors, each with its own lineage (island).
        rounds: search rounds.
        variants: proposals per agent per round.
        trials: Optuna trials per variant with tunable parameters (1 = defaults only).
        top_k: elites kept per kernel.
        migrate_every: every this many rounds an agent may continue from a global elite.
        contenders: variants per kernel per round that get the full timing protocol.
        dispatch: the most variants a kernel's result may hold, each launched on the shapes
            where it was fastest (:mod:`search.dispatch`); 1 keeps one kernel for all shapes.
    """

    population: int = 8
    rounds: int = 5
    variants: int = 2
    trials: int = 4
    top_k: int = 4
    migrate_every: int = 2
    contenders: int = 2
    dispatch: int = 3

    def __post_init__(self) -> None:
        _positive("search", **dataclasses.asdict(self))


@dataclass
class AgentConfig:
    """Which agent backend proposes variants.

    Attributes:
        kind: ``embedded`` (offline), ``llm`` (OpenAI-compatible endpoint), or
            ``module:Class`` naming any :class:`agents.base.Agent` (plug-ins and tests).
        model: model name for the LLM backend.
        strategy: optional strategy name for the embedded backend.
        options: backend-specific settings passed through unchanged.
    """

    kind: str = "embedded"
    model: str = ""
    strategy: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("embedded", "llm") and ":" not in self.kind:
            raise ConfigError(f"agent.kind must be embedded, llm or module:Class, got {self.kind!r}")


@dataclass
class EvaluatorConfig:
    """Where and how candidates are evaluated.

    Attributes:
        kind: ``gpu`` (the sandboxed GPU evaluator) or ``standin`` (CPU test double; its
            numbers are synthetic and never reported as measurements).
        gpus: evaluator actors; None takes every GPU the Ray cluster has (1 for the stand-in).
        seeds: validation seeds per evaluation.
        retries: times an evaluation is retried after its evaluator actor died.
        standin_latency_s: stand-in only: seconds each evaluation sleeps (slow-evaluator tests).
        peers: time the production peers beside the winners at the end of the run.
        peer_runs: independent repetitions of that loop, each in a fresh sandbox process;
            every reported ratio is their median with its min-max.
        compile_trials: torch.compile compilations per mode in each of those loops (more than
            1 needs compile_ahead off: each loop then compiles each mode afresh that often).
        sanitize: run compute-sanitizer (memcheck, racecheck) on each winner before it is
            reported; a winner with findings is replaced by the baseline.
        compile_ahead: compile the end-of-run loops' torch.compile programs ahead of them, once
            per kernel and shape set, in processes beside each other (never beside a timed
            call), into one cache folder that the loops of every round on that shape set load
            from (:mod:`evaluators.peer_compile`): the rounds time the same compilations, so
            their spread is that of timing, not of compiling. Off: every loop compiles for
            itself in its round's set-up, beside the other rounds' set-ups (three times the
            compiling, and the spread shows how compilations vary). Only loops whose peers'
            figures are not in the peer cache compile anything.
        compile_beside_search: with compile_ahead, make those compilations from the run's start,
            beside the search (:mod:`search.compile_ahead`); off: once every final timing is in,
            beside the sanitizer runs, the rounds waiting for them.
        peers_beside_search: with compile_beside_search (and overlap_rounds), time the peers'
            loops beside the search too: once a kernel's compilations on a shape set are in, its
            ``peer_runs`` rounds of peers and baseline (no winner yet) set up in fresh processes
            while the search runs and time once it is over, and the end-of-run loops take their
            figures as they take the peer cache's (anchored on the baseline); off: a run whose
            cache lacks them times the peers in its end-of-run loops.
        overlap_rounds: run the rounds of end-of-run loops beside each other, each in a sandbox
            process of its own that sets its loops up while others do and times them with the GPU
            alone (:mod:`evaluators.gpu_turns`); off: one round at a time, in the evaluator's own
            process, as an exclusive call.
        peer_cache: keep the peers' figures of each end-of-run loop on disk and reuse them in
            later runs on the same GPU model, driver and library versions (:mod:`search.peer_cache`);
            our kernels and the baseline are always timed afresh.
        peer_cache_dir: the folder of that cache (None: ``~/.cache/kernel-search/peer-times``).
        fresh_peers: time every peer afresh even where the cache has its figures (the new
            figures replace the stored ones).
    """

    kind: str = "gpu"
    gpus: int | None = None
    seeds: tuple[int, ...] = (0, 1)
    retries: int = 1
    standin_latency_s: float = 0.0
    peers: bool = True
    peer_runs: int = 3
    compile_trials: int = 1
    sanitize: bool = True
    compile_ahead: bool = True
    compile_beside_search: bool = True
    peers_beside_search: bool = True
    overlap_rounds: bool = True
    peer_cache: bool = True
    peer_cache_dir: str | None = None
    fresh_peers: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("gpu", "standin"):
            raise ConfigError(f"evaluator.kind must be gpu or standin, got {self.kind!r}")
        if self.gpus is not None:
            _positive("evaluator", gpus=self.gpus)
        self.seeds = tuple(int(s) for s in self.seeds)
        if not self.seeds:
            raise ConfigError("evaluator.seeds must name at least one seed")
        _positive("evaluator", peer_runs=self.peer_runs, compile_trials=self.compile_trials)
        if self.compile_ahead and self.compile_trials != 1:
            # A loop's cache folder holds one compilation per mode: a second trial would load the first.
            raise ConfigError("evaluator.compile_ahead needs evaluator.compile_trials 1 "
                              f"(one compilation per mode and loop), got {self.compile_trials}: "
                              "pass --no-compile-ahead (or set evaluator.compile_ahead: false) to compile more")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"evaluator.retries must be >= 0, got {self.retries!r}")
        if not isinstance(self.standin_latency_s, (int, float)) or self.standin_latency_s < 0:
            raise ConfigError(f"evaluator.standin_latency_s must be >= 0, got {self.standin_latency_s!r}")


@dataclass
class RunConfig:
    """The whole run.

    Attributes:
        kernels: library kernel names (ignored when ``kernel_dir`` is set).
        kernel_dir: a folder of kernel folders to optimise instead of the library.
        dtype: run dtype.
        out: parent folder of run directories.
        seed: base seed (agents, Optuna samplers).
        address: an existing Ray cluster to join; None starts a local one.
        search / agent / evaluator: the sections above.
    """

    kernels: tuple[str, ...] = DEFAULT_KERNELS
    kernel_dir: str | None = None
    dtype: str = "float16"
    out: str = "runs"
    seed: int = 0
    address: str | None = None
    search: SearchConfig = field(default_factory=SearchConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)

    def __post_init__(self) -> None:
        if isinstance(self.kernels, str):
            self.kernels = (self.kernels,)
        self.kernels = tuple(self.kernels)
        if not self.kernels and not self.kernel_dir:
            raise ConfigError("no kernels to optimise: give kernels or kernel_dir")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kernels"] = list(self.kernels)
        d["evaluator"]["seeds"] = list(self.evaluator.seeds)
        return d


_SECTIONS = {"search": SearchConfig, "agent": AgentConfig, "evaluator": EvaluatorConfig}


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {sorted(unknown)}; known: {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def config_from_dict(data: Mapping[str, Any]) -> RunConfig:
    """Builds a validated config from plain data (a parsed YAML file).

    Raises:
        ConfigError: an unknown key or an invalid value.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("the config file must hold a mapping at the top level")
    top = dict(data)
    for name, cls in _SECTIONS.items():
        section = top.get(name) or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"config section {name} must be a mapping")
        top[name] = _build(cls, section, name)
    return _build(RunConfig, top, "config")


def load_config(path: str | Path | None) -> RunConfig:
    """Reads a YAML config; None gives the defaults.

    Raises:
        ConfigError: the file is missing, not YAML, or invalid.
    """
    if path is None:
        return RunConfig()
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
    return config_from_dict(data)


def override(config: RunConfig, updates: Mapping[str, Any]) -> RunConfig:
    """Returns a copy with dotted keys (``search.rounds``) replaced; None values are skipped.

    Raises:
        ConfigError: the new values are invalid.
    """
    data = config.to_dict()
    for key, value in updates.items():
        if value is None:
            continue
        *path, leaf = key.split(".")
        node = data
        for part in path:
            node = node[part]
        node[leaf] = value
    return config_from_dict(data)


def dump_config(config: RunConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
