"""``python -m search.reward_serve``: the reward service on a Ray cluster, with its HTTP endpoint.

Examples::

    python -m search.reward_serve --address auto --gpus 1 --port 8477     # in a trainer's cluster
    python -m search.reward_serve --evaluator standin --port 8477          # CPU dry run, numbers not real

The service runs in a named actor (:data:`search.reward_client.ACTOR_NAME` in namespace
:data:`search.reward_client.NAMESPACE`) pinned to the node this command runs on, so its
records (``--out``) and its HTTP port are on this machine; its evaluator actors take one GPU
each wherever the cluster has them, as in a search. It serves until interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from search.reward import RewardConfig, RewardService
from search.reward_client import ACTOR_NAME, NAMESPACE


class RewardActor:
    """A :class:`~search.reward.RewardService` as a Ray actor, plus its HTTP server.

    Args:
        out_dir: the service's record directory.
        config: how to judge.
    """

    def __init__(self, out_dir: str, config: RewardConfig) -> None:
        self.service = RewardService(Path(out_dir), config)
        self.http: Any = None

    def score(self, kernel: str, source: str, dtype: str = "", client: str = "",
              context: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.service.score(kernel, source, dtype, client, context=context)

    def record(self, name: str, row: dict[str, Any]) -> None:
        if name != "trajectories":
            raise ValueError(f"only trajectories may be recorded from outside, not {name!r}")
        from search.trajectory import Trajectory

        self.service.record(name, Trajectory.from_dict(row).to_dict())

    def stats(self) -> dict[str, Any]:
        return self.service.stats()

    def device(self) -> str:
        """The name of the device the first evaluator runs on (``cpu-standin`` for the stand-in)."""
        return self.service.pool.device_name()

    def serve_http(self, host: str = "0.0.0.0", port: int = 0) -> str:
        """Starts the HTTP endpoint on this actor's node; returns its URL."""
        from search.reward_http import serve

        if self.http is None:
            self.http = serve(self.service, host, port)
        shown = host if host not in ("0.0.0.0", "") else _node_ip()
        return f"http://{shown}:{self.http.port}"

    def close(self) -> None:
        if self.http is not None:
            self.http.shutdown()
        self.service.close()


def _node_ip() -> str:
    import ray

    try:
        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - only the address shown in a message
        return socket.gethostname()


def start_actor(out_dir: Path, config: RewardConfig, max_concurrency: int = 256) -> Any:
    """Starts the named service actor on this node (Ray must be started)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    # Every concurrent request holds one of the actor's threads while it waits for its verdict.
    actor_cls: Any = ray.remote(RewardActor)
    return actor_cls.options(name=ACTOR_NAME, namespace=NAMESPACE, num_cpus=0, max_concurrency=max_concurrency,
                             scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)
                             ).remote(str(Path(out_dir).resolve()), config)


def build_parser() -> argparse.ArgumentParser:
    from search.run import OneLineErrorParser

    p = OneLineErrorParser(prog="python -m search.reward_serve", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", help="address of an existing Ray cluster (a trainer's); default: a local one")
    p.add_argument("--evaluator", choices=("gpu", "standin"), default="gpu",
                   help="standin: CPU test double, never for reported numbers")
    p.add_argument("--gpus", type=int, default=1, help="evaluator actors, one GPU each")
    p.add_argument("--dtype", default="float16", help="dtype of requests that name none")
    p.add_argument("--kernel", action="append", dest="kernels", default=[], help="a kernel requests may name "
                   "(repeatable; default: any library kernel)")
    p.add_argument("--no-gates", action="store_true", help="pay on the search shapes' verdict alone "
                   "(no held-out shapes, sanitizer or peers' loop: faster, easier to game)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8477, help="HTTP port (0: any free one)")
    p.add_argument("--out", type=Path, default=Path("runs/rewards"), help="record directory")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import ray

    from search.run import UsageError, quiet_ray_auth_notice, start_ray

    args = build_parser().parse_args(argv)
    gates = not args.no_gates
    config = RewardConfig(evaluator=args.evaluator, gpus=args.gpus, dtype=args.dtype, kernels=tuple(args.kernels),
                          heldout=gates, sanitize=gates, loop=gates, compile_on_cpu_nodes=bool(args.address))
    quiet_ray_auth_notice()
    try:
        start_ray(dataclasses.replace(config.run_config(), address=args.address))
    except UsageError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if args.evaluator == "gpu" and int(ray.cluster_resources().get("GPU", 0)) < args.gpus:
        print(f"error: the Ray cluster has {int(ray.cluster_resources().get('GPU', 0))} GPU(s), "
              f"--gpus {args.gpus} asked; use --evaluator standin for a dry run", file=sys.stderr)
        return 2
    actor = start_actor(args.out, config)
    url = ray.get(actor.serve_http.remote(args.host, args.port))
    print(f"reward service: {url}/score (OpenRLHF: {url}/openrlhf); actor {ACTOR_NAME!r} in namespace "
          f"{NAMESPACE!r}; records in {args.out}", flush=True)
    try:
        while True:
            time.sleep(60)
            print(f"served {ray.get(actor.stats.remote())}", flush=True)
    except KeyboardInterrupt:
        ray.get(actor.close.remote())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
