"""Fixtures of the CPU tests that need a real Ray."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A small local Ray cluster (2 CPUs) for one test module, with the run's worker environment."""
    import ray

    from search.run import worker_runtime_env

    ray.init(num_cpus=2, include_dashboard=False, runtime_env=worker_runtime_env(), log_to_driver=False)
    yield
    ray.shutdown()
