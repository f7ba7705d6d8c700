"""A variant: one proposed kernel source for one library kernel, with where it came from."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kernels.launch import LaunchSpec, parse_launch_header


def source_hash(source: str) -> str:
    """Hash of the exact source bytes. No normalisation: any rule that maps two texts to one
    id (``splitlines`` also breaks at form feeds and other separators the compiler reads
    differently) lets a variant inherit the verdict of a different program. Sources that
    differ only in whitespace still share a verdict through deduplication by binary."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class Variant:
    """One kernel variant: the ``.cu`` source (kernel plus launch header) and its lineage.

    Attributes:
        kernel: library kernel name this variant implements.
        source: the full variant file.
        parent: id of the variant it was derived from ('' for a baseline or a seed).
        author: who proposed it (agent id, 'baseline', 'user').
        note: what was changed, in a few words (planner suggestion / transformation name).
        round: search round in which it was proposed.
    """

    kernel: str
    source: str
    parent: str = ""
    author: str = ""
    note: str = ""
    round: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return source_hash(self.source)

    def launch(self) -> LaunchSpec:
        return parse_launch_header(self.source)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Variant:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
