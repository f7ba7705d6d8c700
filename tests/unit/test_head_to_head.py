"""The head-to-head of two sets of best kernels: sides as shipped, ratios, verdicts (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import head_to_head as h


def _write(folder: Path, kernel: str, members: list[tuple[str, dict[str, int]]], table: dict[str, int] | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    variants = [{"source": src, "id": f"id{i}"} for i, (src, _) in enumerate(members)]
    record = {"kernel": kernel, "dtype": "float16", "variant": variants[0], "params": members[0][1]}
    if table is not None:
        record["dispatch"] = {"members": [{"variant": v, "params": p} for v, (_, p) in zip(variants, members, strict=True)],
                              "table": table}
    (folder / f"{kernel}.json").write_text(json.dumps(record))


def test_load_side_reads_a_primary_alone_and_a_dispatch_table(tmp_path: Path) -> None:
    _write(tmp_path / "old", "k", [("src-a", {"B": 1})], None)
    _write(tmp_path / "new", "k", [("src-b", {"B": 2}), ("src-c", {"B": 4})], {"[1]": 1, "[2]": 0})
    old, new = h.load_side(tmp_path / "old", "k"), h.load_side(tmp_path / "new", "k")
    assert old == {"members": [("src-a", {"B": 1}, "id0")], "table": {}, "dtype": "float16"}
    assert new is not None and [m[0] for m in new["members"]] == ["src-b", "src-c"]
    assert new["table"] == {"[1]": 1, "[2]": 0}
    assert h.load_side(tmp_path / "old", "absent") is None
    trimmed = json.loads((tmp_path / "old" / "k.json").read_text())
    del trimmed["variant"]["source"]
    (tmp_path / "old" / "k.json").write_text(json.dumps(trimmed))
    (tmp_path / "old" / "k.cu").write_text("src-beside")
    assert h.load_side(tmp_path / "old", "k")["members"] == [("src-beside", {"B": 1}, "id0")]  # type: ignore[index]
    ours = h.loop_kernels({"old": old, "new": new}, "base-src")
    assert ours == {"baseline": ("base-src", {}), "old": ("src-a", {"B": 1}), "new": ("src-b", {"B": 2}),
                    "new#1": ("src-c", {"B": 4})}


def _sides() -> dict[str, dict]:
    return {"old": {"members": [("a", {}, "a")], "table": {}},
            "new": {"members": [("b", {}, "b"), ("c", {}, "c")], "table": {"[1]": 1, "[2]": 0}}}


def test_each_side_is_timed_as_shipped_by_its_dispatch_table() -> None:
    times = {"baseline": {"[1]": 9.0, "[2]": 9.0}, "old": {"[1]": 2.0, "[2]": 4.0},
             "new": {"[1]": 3.0, "[2]": 2.0}, "new#1": {"[1]": 1.0, "[2]": 8.0}, "torch_compile": {"[1]": 2.0, "[2]": 2.0}}
    run = h.compose(times, _sides())
    assert run == {"baseline": {"[1]": 9.0, "[2]": 9.0}, "old": {"[1]": 2.0, "[2]": 4.0},
                   "new": {"[1]": 1.0, "[2]": 2.0}, "torch_compile": {"[1]": 2.0, "[2]": 2.0}}
    spreads = h.ratios([run])
    assert spreads["new_vs_torch_compile"]["median"] == pytest.approx(2.0 ** 0.5)
    assert set(spreads) == {"new_vs_old", "new_vs_baseline", "old_vs_baseline", "new_vs_torch_compile"}


def test_verdicts_need_the_whole_range_and_failures_remove_a_side() -> None:
    def reply(old: float, new: float) -> dict:
        return {"peers": {"baseline": {"[1]": 9.0, "[2]": 9.0}, "old": {"[1]": old, "[2]": old},
                          "new": {"[1]": 8.0, "[2]": new}, "new#1": {"[1]": new, "[2]": 8.0}}}

    faster = h.kernel_result("k", "float16", [reply(2.0, 1.0), reply(2.2, 1.0), reply(2.1, 1.0)], _sides())
    assert faster["spreads"]["new_vs_old"]["verdict"] == "faster"
    assert faster["spreads"]["new_vs_old"]["median"] == pytest.approx(2.1)
    tie = h.kernel_result("k", "float16", [reply(1.0, 1.05), reply(1.0, 0.95), reply(1.0, 1.0)], _sides())
    assert tie["spreads"]["new_vs_old"]["verdict"] == "tie"
    slower = h.kernel_result("k", "float16", [reply(1.0, 1.2), reply(1.0, 1.1), {"loop_error": "boom"}], _sides())
    assert slower["spreads"]["new_vs_old"]["verdict"] == "slower" and slower["loops"] == 2
    assert slower["errors"] == ["loop 3: boom"]
    bad = reply(2.0, 1.0) | {"failed": {"new#1": "WRONG_OUTPUT"}}
    failed = h.kernel_result("k", "float16", [reply(2.0, 1.0), bad], _sides())
    assert "new_vs_old" not in failed["spreads"] and failed["failed"] == {"new#1": "loop 2: WRONG_OUTPUT"}
    assert "old_vs_baseline" in failed["spreads"]
    s = h.summary([faster, tie, slower, failed])
    assert s["verdicts"] == {"faster": 1, "tie": 1, "slower": 1} and s["new_slower"] == ["k"]
    assert s["not_compared"] == ["k"] and s["compared"] == 3
    text = h.to_markdown({"command": "c", "git_commit": "g", "gpu": "G", "date": "d", "old": "o", "new": "n",
                          "timing": "t"}, [faster])
    assert "2.100x" in text and "| [1] | 9000.00 | 2100.00 | 1000.00 |" in text


def test_cli_refuses_folders_that_are_not_there(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        h.main(["--old", str(tmp_path / "nope"), "--new", str(tmp_path), "--out", str(tmp_path / "x")])
