"""The generator's one-pass (online) max and sum of exp(x - max), checked on the CPU.

The scalar device functions of the online prelude (the update by a vector, one element long
on the scalar path, the combination of two partial pairs, the end fix-up) are compiled as host
C++ (the CUDA-only qualifiers defined away) and fold rows split into several partial pairs, the way threads and warps split a row;
the result must be the two-pass formula's, max(x) and sum(exp(x - max(x))), including its NaN
for rows of -inf only, rows holding +inf or NaN, and with empty partials.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest

from agents.embedded.codegen.cuda_text import ONLINE_PRELUDE

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")

INF = math.inf
ROWS = [
    [1.0, 2.0, 3.0],
    [-5.0, 10.0, 0.5, 9.99, -INF, 3.0],
    [-INF, -INF, -INF],  # two-pass: exp(-inf - -inf) = NaN
    [-INF, 2.0, -INF],
    [1.0, INF, 2.0],  # two-pass: exp(inf - inf) = NaN
    [1.0, math.nan, 2.0],
    [88.0, -88.0, 0.0, 87.5],
    [0.0],
    list(np.random.default_rng(0).normal(0, 30, 257)),
    [-INF] * 8 + [3.0] + [-INF] * 7 + [1.0, 2.0],  # a chunk of -inf only, then chunks with some
    [1.0] * 9 + [INF] + [0.5] * 6,
    [2.0] * 12 + [math.nan] + [1.0] * 5,
    list(np.random.default_rng(1).normal(0, 30, 64)) + [-INF] * 8,
]
PARTS = (1, 2, 3, 8, 40)  # partial pairs per row; more than elements leaves some empty


def _host_source(rows: list[list[float]]) -> str:
    # The scalar functions only: the warp and block ones need shuffles and shared memory.
    scalar = "\n\n".join(f for f in ONLINE_PRELUDE.split("\n\n") if "__shfl" not in f and "__shared__" not in f)
    cases = []
    for row in rows:
        values = ", ".join("NAN" if math.isnan(v) else "INFINITY" if v == INF else "-INFINITY" if v == -INF
                           else f"{float(v)!r}f" for v in row)
        cases.append(f"{{ {values} }}")
    lengths = ", ".join(str(len(r)) for r in rows)
    return f"""
#include <math.h>
#include <stdio.h>
#include <string.h>
#define __device__
#define __forceinline__ inline
static inline float __int_as_float(unsigned u) {{ float f; memcpy(&f, &u, 4); return f; }}
{scalar}
static const float rows[][300] = {{ {", ".join(cases)} }};
static const int lengths[] = {{ {lengths} }};
int main() {{
    const int parts[] = {{ {", ".join(map(str, PARTS))} }};
    for (int r = 0; r < {len(rows)}; ++r) {{
        for (int p : parts) {{
            // Element i goes to partial i % p (as lane i of p threads); partials combined in a tree.
            float m[64], s[64];
            for (int k = 0; k < p; ++k) {{ m[k] = -INFINITY; s[k] = 0.0f; }}
            for (int i = 0; i < lengths[r]; ++i) cg_online_vec<1>(m[i % p], s[i % p], {{rows[r][i]}});
            for (int width = 1; width < p; width *= 2)
                for (int k = 0; k + width < p; k += 2 * width) cg_online_combine(m[k], s[k], m[k + width], s[k + width]);
            printf("%d %d %.9g %.9g\\n", r, p, m[0], cg_online_end(m[0], s[0], lengths[r]));
            // The same with whole 8-element chunks through cg_online_vec (chunk c to partial
            // c % p, as a thread's vectors), the tail element by element; reported as -p.
            for (int k = 0; k < p; ++k) {{ m[k] = -INFINITY; s[k] = 0.0f; }}
            int i = 0;
            for (int c = 0; i + 8 <= lengths[r]; ++c, i += 8) {{
                float chunk[8];
                for (int e = 0; e < 8; ++e) chunk[e] = rows[r][i + e];
                cg_online_vec<8>(m[c % p], s[c % p], chunk);
            }}
            for (; i < lengths[r]; ++i) cg_online_vec<1>(m[0], s[0], {{rows[r][i]}});
            for (int width = 1; width < p; width *= 2)
                for (int k = 0; k + width < p; k += 2 * width) cg_online_combine(m[k], s[k], m[k + width], s[k + width]);
            printf("%d %d %.9g %.9g\\n", r, -p, m[0], cg_online_end(m[0], s[0], lengths[r]));
        }}
    }}
}}
"""


def _two_pass(row: list[float]) -> tuple[float, float]:
    x = np.asarray(row, dtype=np.float32)
    top = np.float32(np.nan) if np.isnan(x).any() else x.max()
    with np.errstate(invalid="ignore", over="ignore"):
        return float(top), float(np.exp((x - top).astype(np.float64)).sum())


def test_online_pairs_give_the_two_pass_max_and_sum(tmp_path):
    (tmp_path / "online.cpp").write_text(_host_source(ROWS))
    subprocess.run([CXX, "-O1", "-std=c++17", "online.cpp", "-o", "online"], cwd=tmp_path, check=True,
                   capture_output=True)
    out = subprocess.run([str(tmp_path / "online")], capture_output=True, text=True, check=True).stdout.split("\n")
    lines = [line.split() for line in out if line]
    assert len(lines) == 2 * len(ROWS) * len(PARTS)
    for r, p, m, s in lines:
        want_m, want_s = _two_pass(ROWS[int(r)])
        got_m, got_s = float(m), float(s)
        where = f"row {r} in {abs(int(p))} partials" + (", 8-element chunks" if int(p) < 0 else "")
        assert (math.isnan(got_m), math.isnan(got_s)) == (math.isnan(want_m), math.isnan(want_s)), where
        if not math.isnan(want_m):
            assert np.float32(got_m) == np.float32(want_m), where  # printed with 9 digits: float32 exactly
        if not math.isnan(want_s):
            assert got_s == pytest.approx(want_s, rel=1e-5), where
