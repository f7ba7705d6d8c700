"""Row schedules: reductions over each row's columns, then maps (norms, softmax, per-row
quantisation, losses).

- ``rows/warp``: one row per warp, ROWS rows per block.
- ``rows/block``: a row per group of threads sized to the row, short rows several to a block.
- ``rows/cluster`` (sm_90): below SPLIT rows, or for rows longer than one block's registers
  hold, a row split over a cluster of CL blocks whose partials are combined through
  distributed shared memory; else as rows/block.

Each: one pass over the row per level of dependent reductions, the first ITEMS vectors of
each thread kept in registers between passes (as loaded, in the input's dtype), the rest
re-read RU vectors at a time (1 in the cluster schedule); fp32 accumulation, warp shuffles
then shared memory across warps. ``+online`` (block and cluster): a max and a sum of
exp(x - max) over the same row in one pass (online softmax).

A top-k along the row (``rows/block`` and ``rows/warp``, with at least a thread per pick):
after the reductions it reads, either one pass per pick, each keeping the best element ranked
after the previous pick, and a reduction of (value, column) pairs over the row's threads, or
(tune SELECT) a radix select of the k-th ranked element, 8 bits a pass, then the k picks
gathered and ordered in shared memory; the same picks either way. Thread j keeps pick j, so
values over the picks are per-thread row values, and reductions that read the picks (a top-k
filter's softmax) come after them.
"""

from __future__ import annotations

from collections.abc import Mapping

from agents.embedded.codegen.cuda_text import (
    CLUSTER_ONLINE_PRELUDE,
    CLUSTER_PRELUDE,
    ONLINE_PRELUDE,
    PRELUDE,
    TOPK_PRELUDE,
)
from agents.embedded.codegen.emit import (
    IDENTITY,
    OPCODE,
    SCALAR_READ,
    Emitter,
    Schedule,
    c_size,
    entry,
    entry_args,
    entry_params,
    header,
)
from agents.embedded.codegen.ir import Op, PickReduce, Program, Reduce, of_picks, walk
from agents.embedded.codegen.trace import Unsupported
from agents.embedded.launch_fill import FILL_BLOCKS
from kernels.spec import KernelSpec


def online_pairs(program: Program) -> dict[int, int]:
    """Sums of ``exp(x - max(x))`` over a row whose max is a reduction of the same ``x``, by
    the sum's index -> the max's index: each such pair can be computed in one pass."""
    pairs: dict[int, int] = {}
    for r in program.reductions:
        body = r.body
        if r.kind != "sum" or not (isinstance(body, Op) and body.name == "exp"):
            continue
        inner = body.args[0]
        if not (isinstance(inner, Op) and inner.name == "sub" and isinstance(inner.args[1], Reduce)):
            continue
        top = inner.args[1]
        if top.kind == "max" and top.body == inner.args[0] and top.index not in pairs.values():
            pairs[r.index] = top.index
    return pairs


def _levels(reductions: list[Reduce], fused: Mapping[int, int] | None = None) -> list[list[Reduce]]:
    """Reductions grouped so that each group depends only on earlier groups (one pass each);
    a sum in ``fused`` (sum -> max, see :func:`online_pairs`) goes with its max. Reductions
    outside ``reductions`` that they read are done before."""
    fused = fused or {}
    level: dict[int, int] = {}
    for r in reductions:  # in creation order: dependencies come first
        if r.index in fused:
            level[r.index] = level[fused[r.index]]
            continue
        inner = [n for n in walk([r.body]) if isinstance(n, Reduce) and n is not r and n.index in level]
        level[r.index] = 1 + max((level[n.index] for n in inner), default=-1)
    out: list[list[Reduce]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for r in reductions:
        out[level[r.index]].append(r)
    return out


def _fill(em: Emitter, fill: set[int]) -> list[str]:
    """Loads the register cache of the full leaves ``fill`` (a pass's loads without its work)."""
    first = "cg_lane + static_cast<long long>(cg_j) * cg_g"
    loads = [f"cg_cache{i}[cg_j] = *reinterpret_cast<const Pack<{em.c_type(em.full_leaves[i].arg)}, V>*>"
             f"({em.full_leaves[i].arg} + cg_base{i} + cg_c);" for i in sorted(fill)]
    return ["#pragma unroll", "for (int cg_j = 0; cg_j < ITEMS; ++cg_j) {", f"    const cg_idx cg_c = ({first}) * V;",
            f"    if (cg_active && {first} < cg_nvec) {{", *("        " + x for x in loads), "    }", "}"] if loads else []


# SELECT=2 (the default) takes the radix select for this many picks or more: a pass per pick
# costs k passes over the row, the radix select 2 to 5 (up to 9 with ties to cut by column)
# and a sort of the k picks in shared memory.
RADIX_FROM = 8


def topk_lines(em: Emitter, program: Program, cached: set[int], filled: set[int], unroll: str) -> list[str]:
    """The picks of the program's top-k, by one pass over the row each or by a radix select
    (its passes read the first ITEMS vectors from the register cache; the element's part is
    ``cg_pick_element``, defined per way), thread j of the row keeping pick j (``cg_pv``, ``cg_pc``); then
    the row values made from the picks, each a reduction or a broadcast over the row's
    threads, every thread taking part (their barriers stay uniform)."""
    topk = program.topk
    assert topk is not None
    exprs: list[tuple[str, object]] = [("pick:", topk.key)]
    fill = (em.used_leaves(exprs) & cached) - filled
    filled |= fill
    lines = _fill(em, fill) + em.take_row_lines()
    body = _pass(em, exprs, cached, set(), unroll)
    lines += em.take_row_lines()
    largest = "true" if topk.largest else "false"
    lines += [
        f"const long long cg_npick = {c_size(topk.count, 'long long')};",
        "if (cg_npick > cg_g) __trap();  // a pick per thread of the row: the launch gives each row k threads or more",
        "float cg_pv = 0.0f;  // this thread's pick; past the k-th, column 0 (its reads stay in the row)",
        "long long cg_pc = 0;",
        # The same picks either way; SELECT=2 takes the radix select from RADIX_FROM picks on.
        f"if (SELECT == 1 || (SELECT == 2 && cg_npick >= {RADIX_FROM})) {{",
        "    CgRadix cg_rs = cg_radix_begin(cg_npick);",
        "    for (int cg_phase = 0; cg_phase < 9; ++cg_phase) {",
        "        // A phase only while some row of the block needs it (uniform: read after a barrier).",
        "        if (cg_phase > 0 && cg_phase < 8 && !cg_radix_shared().busy) continue;",
        f"        auto cg_pick_element = [&](float v, long long c) {{ cg_radix_element<{largest}>(cg_rs, cg_phase, cg_npick, v, c); }};",
        *("        " + x for x in body),
        "        if (cg_phase < 8) cg_radix_choose(cg_rs, cg_phase);",
        "    }",
        f"    cg_radix_order<{largest}>(cg_npick, cg_pv, cg_pc);",
        "} else {",
        "    float cg_lv = 0.0f;  // the previous pick",
        "    long long cg_lc = -1;",
        "    for (long long cg_pick = 0; cg_pick < cg_npick; ++cg_pick) {",
        "        float cg_bv = 0.0f;  // the best element ranked after the previous pick (column -1: none yet)",
        "        long long cg_bc = -1;",
        f"        auto cg_pick_element = [&](float v, long long c) {{ cg_best_update<{largest}>(cg_bv, cg_bc, cg_lv, cg_lc, cg_pick == 0, v, c); }};",
        *("        " + x for x in body),
        f"        cg_group_best<{largest}>(cg_bv, cg_bc);",
        "        if (cg_lane == cg_pick && cg_bc >= 0) {  // (a row past the end has none)",
        "            cg_pv = cg_bv;",
        "            cg_pc = cg_bc;",
        "        }",
        "        cg_lv = cg_bv;",
        "        cg_lc = cg_bc;",
        "    }",
        "}",
    ]
    for node in program.picked:
        value = em.row_expr(node.body)
        lines += em.take_row_lines()
        if isinstance(node, PickReduce):
            identity = IDENTITY[node.kind]
            lines.append(f"const float cg_pr{node.index} = cg_group_reduce<{OPCODE[node.kind]}>("
                         f"cg_lane < cg_npick ? static_cast<float>({value}) : {identity}, {identity});")
        else:
            ct = em.c_kind(em.kind(node.body))
            at = "cg_npick - 1" if node.at == "last" else node.at
            lines.append(f"const {ct} cg_pa{node.index} = cg_group_at<{ct}>(static_cast<{ct}>({value}), {at});")
    return lines


def _pass(em: Emitter, exprs: list[tuple[str, object]], cached: set[int], fill: set[int], unroll: str) -> list[str]:
    """One pass over the row: the first ITEMS vectors of each thread (kept in registers), then
    the rest of the row, re-read ``unroll`` vectors at a time. Both parts issue their row
    loads first (the cache's fill of all ITEMS vectors, then the arithmetic; a weight's vectors
    stay loaded at use, see :meth:`Emitter.staged_loops`): a load-then-fold loop under a guard
    per vector came out of ptxas as one branch per vector, each waiting on its load before the
    next was issued (read in the SASS of rows/block). More vectors re-read at a time cost
    registers, so occupancy, in every launch. Each thread still takes its vectors in order, so
    a reduction's bits do not depend on it."""
    first = "cg_lane + static_cast<long long>(cg_j) * cg_g"
    regs = em.staged_loops(exprs, "ITEMS", "cg_j", f"({first}) * V", f"cg_active && {first} < cg_nvec",
                           cached=cached, fill=fill)
    vec = "cg_i0 + static_cast<long long>(cg_u) * cg_g"
    rest = em.staged_loops(exprs, unroll, "cg_u", f"({vec}) * V", f"{vec} < cg_nvec")
    if len(cached) < len(em.full_leaves):
        # Its own scope: a pass stages the leaves it does not cache (an int8 or bool row) in
        # arrays of the same names as the next pass's.
        regs = ["{", *("    " + x for x in regs), "}"]
    return [
        *regs,
        f"for (long long cg_i0 = cg_lane + static_cast<long long>(ITEMS) * cg_g; cg_active && cg_i0 < cg_nvec; cg_i0 += {unroll} * cg_g) {{",
        *("    " + x for x in rest),
        "}",
    ]


def rowwise(spec: KernelSpec, program: Program, mode: str, online: bool = False) -> Schedule:
    """Row reductions then maps. ``mode``: ``warp`` (one row per warp), ``block`` (one row per
    block) or ``cluster`` (one row per cluster of CL blocks, sm_90). ``online``: each max and
    sum of exp(x - max) pair (:func:`online_pairs`; there must be one) in one pass."""
    em = Emitter(spec, program)
    if any(leaf.access in SCALAR_READ for leaf in em.full_leaves):
        raise Unsupported("a column gather or a cat in a row reduction's schedule")
    cluster = mode == "cluster"
    if program.topk is not None and (cluster or online):
        raise Unsupported("a top-k in a cluster or online schedule")
    fused = online_pairs(program) if online else {}
    if online and not fused:
        raise Unsupported("no max and sum of exp(x - max) to compute online")
    partner = {i_max: i_sum for i_sum, i_max in fused.items()}
    reduce_fn = "cg_cluster_reduce" if cluster else "cg_group_reduce"
    cached = {i for i, leaf in enumerate(em.full_leaves) if em.is_float_arg(leaf.arg)}
    # Registers kept per thread: cached leaves x ITEMS vectors, at most 64 counted at fp32 (8
    # per vector; a 16-bit vector takes 4).
    items = tuple(v for v in (4, 2, 8, 1) if max(1, len(cached)) * v * 8 <= 64) or (1,)
    # Vectors re-read at a time past the registers' ITEMS: RU, 1 first as measured so far, at
    # most 2 under the online schedules' 64-register bound. The cluster schedule keeps 1: it
    # splits the long rows it is for, and RU=2 spilled there (layer norm, bf16).
    unroll = "1" if cluster else "RU"
    ru = (1, 2) if online else (1, 2, 4)
    select: dict[str, tuple[int, ...]] = {}
    if program.topk is not None:
        # Its pick passes hold more live values beside the cache (the best so far, the previous
        # pick): ptxas spilled 324-448 B at ITEMS 8 and up to 92 B at ITEMS 4 with RU 2 (top-k
        # filter, fp16/bf16, rows/block), none at ITEMS 2 or with RU 1.
        items, ru = tuple(v for v in (2, 4, 1) if v in items) or (1,), (2, 1)
        select = {"SELECT": (2, 1, 0)}  # 2: by the pick count (RADIX_FROM), 1: radix select, 0: a pass per pick
    bases = em.leaf_bases("cg_row")
    lines = em.take_row_lines() + bases
    row_out = [(n, e) for n, (space, e) in program.outputs.items() if space == "row"]
    pick_out = [(n, e) for n, (space, e) in program.outputs.items() if space == "pick"]
    row_exprs = [e for _, e in row_out + pick_out]
    em.preload_row_values(row_exprs)  # the row outputs' own loads, with the row's
    lines += em.take_row_lines()
    lines += [f"Pack<{em.c_type(em.full_leaves[i].arg)}, V> cg_cache{i}[ITEMS];" for i in sorted(cached)]
    filled: set[int] = set()
    extra = ", cg_split" if cluster else ""
    after = {r.index for r in program.reductions if of_picks(r.body)}  # (a top-k's) after its picks
    levels = _levels([r for r in program.reductions if r.index not in after], fused)
    if program.topk is not None:
        levels.append([])  # the picks
    levels += _levels([r for r in program.reductions if r.index in after])
    for level, group in enumerate(levels):
        if not group:
            lines += topk_lines(em, program, cached, filled, unroll)
            continue
        plain = [r for r in group if r.index not in fused and r.index not in partner]
        exprs: list[tuple[str, object]] = [(f"red:{r.index}", r.body) for r in plain]
        exprs += [(f"online:{r.index}:{partner[r.index]}", r.body) for r in group if r.index in partner]
        fill = (em.used_leaves(exprs) & cached) - filled
        body = _pass(em, exprs, cached, fill, unroll)
        filled |= fill
        lines += em.take_row_lines()
        lines += [f"float cg_acc{r.index} = {IDENTITY[r.kind]};" for r in group]
        lines += body
        if level == 0:  # after the first pass's loads: the row outputs' gathers
            em.preload_gathers(row_exprs)
            lines += em.take_row_lines()
        lines += [f"const float cg_red{r.index} = {reduce_fn}<{OPCODE[r.kind]}>(cg_acc{r.index}, {IDENTITY[r.kind]}{extra});"
                  for r in plain]
        for r in group:
            if r.index in partner:
                i_max, i_sum = r.index, partner[r.index]
                lines += [f"{'cg_cluster_online' if cluster else 'cg_online_group'}(cg_acc{i_max}, cg_acc{i_sum}{extra});",
                          f"const float cg_red{i_max} = cg_acc{i_max};",
                          f"const float cg_red{i_sum} = cg_online_end(cg_acc{i_max}, cg_acc{i_sum}, cg_cols);"]
    full_out = [(f"out:{n}", e) for n, (space, e) in program.outputs.items() if space == "full"]
    if full_out:
        body = _pass(em, full_out, cached, (em.used_leaves(full_out) & cached) - filled, unroll)
        lines += em.take_row_lines()
        lines += body
    if pick_out:
        stores = []
        for name, expr in pick_out:  # thread j writes pick j
            value = em.row_expr(expr)
            stores.append(f"{name}[cg_row * cg_npick + cg_lane] = {em.store_value(name, value, em.kind(expr))};")
        lines += ["if (cg_active && cg_lane < cg_npick) {", *("    " + x for x in em.take_row_lines() + stores), "}"]
    if row_out:
        stores = []
        for name, expr in row_out:
            value = em.row_expr(expr)
            stores.append(f"{name}[cg_row] = {em.store_value(name, value, em.kind(expr))};")
        leader = "cg_lane == 0"  # the row's first thread (of the cluster's first block)
        lines += [f"if (cg_active && {leader}) {{", *("    " + x for x in em.take_row_lines() + stores), "}"]
    if cluster:
        lines.append("if (cg_split) cg_cluster_sync();  // no block leaves while another may read its shared memory")
        place = [
            "    // As the launch header computes it: CL blocks per row below SPLIT rows or for a row longer",
            "    // than one block's registers hold (512 threads x ITEMS vectors of 8), else one.",
            f"    const bool cg_split = {em.rows} < SPLIT || cg_cols > 4096LL * ITEMS;",
            "    // Split: CL blocks per row. Else blockDim.y rows per block, as in rows/block.",
            "    const long long cg_r = cg_split ? static_cast<long long>(blockIdx.x) / CL",
            "                                    : static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;",
            f"    const bool cg_active = cg_r < {em.rows};  // the grid is rounded up to whole clusters",
            "    const int cg_lane = (cg_split ? static_cast<int>(blockIdx.x % CL) * blockDim.x : 0) + threadIdx.x;",
            "    const int cg_g = (cg_split ? CL : 1) * blockDim.x;",
        ]
    else:
        place = [
            "    const long long cg_r = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;",
            "    // Threads of rows past the end still take part in the block's barriers.",
            f"    const bool cg_active = cg_r < {em.rows};",
            "    const int cg_lane = threadIdx.x;",
            "    const int cg_g = blockDim.x;",
        ]
    text = [
        PRELUDE,
        *([CLUSTER_PRELUDE] if cluster else []),
        *([ONLINE_PRELUDE] if online else []),
        *([CLUSTER_ONLINE_PRELUDE] if online and cluster else []),
        *([TOPK_PRELUDE] if program.topk is not None else []),
        f"template <int V>\n__device__ __forceinline__ void cg_run({entry_params(spec)}) {{",
        f"    const long long cg_cols = {em.cols};",
        *place,
        "    const long long cg_row = cg_active ? cg_r : 0;",
        "    const long long cg_obase = cg_row * cg_cols;",
        "    const long long cg_nvec = cg_cols / V;",
        *("    " + x for x in lines),
        "}",
    ]
    outputs = [n for n, (space, _) in program.outputs.items() if space == "full"]
    call = "cg_run<{v}>(" + entry_args(spec) + ")"
    bound, attrs = "512", ""
    if mode == "warp":
        grid, block, bound = f"(cdiv({program.rows}, ROWS),)", "(32, ROWS)", "32 * ROWS"
        tune = {"ROWS": (4, 2, 8, 1), "ITEMS": items, "RU": ru, **select}
        what = "one row per warp, ROWS rows per block"
        if program.topk is not None:  # a thread per pick at least: a warp per 32 picks
            tx = f"32 * cdiv({program.topk.count}, 32)"
            ry = f"max(1, min(ROWS, 512 // ({tx})))"
            grid, block, bound = f"(cdiv({program.rows}, {ry}),)", f"({tx}, {ry})", "512"
            what = "one row per warp (a warp per 32 picks of the top-k), ROWS rows per block"
    elif mode == "block":
        # Threads per row: a warp per 256 * ITEMS elements (ITEMS 16-byte vectors of 16-bit
        # elements per thread), up to 512; a row of at most 128, 64 or 32 x ITEMS elements gets
        # 16, 8 or 4 threads (no idle lanes); rows shorter than a block share it, as long as
        # FILL_BLOCKS blocks remain. A top-k's row has a thread per pick at least, in whole warps.
        c = program.cols
        narrow = " - ".join(f"{w} * min(1, max(0, {8 * w} * ITEMS + 1 - {c}))" for w in (16, 8, 4))
        tx = f"min(512, 32 * cdiv({c}, 256 * ITEMS) - {narrow})"
        if program.topk is not None:
            tx = f"min(512, 32 * max(cdiv({c}, 256 * ITEMS), cdiv({program.topk.count}, 32)))"
        ry = f"max(1, min(256 // {tx}, cdiv({program.rows}, {FILL_BLOCKS})))"
        grid, block = f"(cdiv({program.rows}, {ry}),)", f"({tx}, {ry})"
        tune = {"ITEMS": tuple(v for v in items if v != 8) if online else items, "RU": ru, **select}
        what = "one row per block of threads sized to the row, short rows several to a block"
    else:
        # Blocks per row: CL below SPLIT rows (too few rows to fill the GPU) or when a row is longer
        # than one block's registers hold (it is then read once instead of once per pass), else 1.
        flag = f"min(1, max(0, SPLIT - {program.rows}, {program.cols} - 4096 * ITEMS))"  # 1: split
        tx1 = f"min(512, max(32, 32 * cdiv({program.cols}, 256 * ITEMS)))"  # as rows/block
        tx = f"min(512, max(32, 32 * cdiv({program.cols}, 256 * ITEMS * (1 + (CL - 1) * {flag}))))"
        # Split: CL blocks per row, one row per block; else rows/block's blocks, rounded up to
        # whole clusters (R x CL is never fewer than rows/block's count).
        blocks = f"max(cdiv({program.rows}, max(1, 256 // {tx1})), {flag} * {program.rows} * CL)"
        grid, block = f"(CL * cdiv({blocks}, CL),)", f"({tx}, max(1, (256 // {tx1}) * (1 - {flag})))"
        # A row split CL ways is short per block: 4 vectors per thread hold a 128K-element fp16
        # row in 8 blocks of 512; 8 spill at fp32 with the cluster code, 1 puts its cache on
        # the stack there.
        tune = {"CL": (8, 4, 2), "ITEMS": tuple(v for v in items if v in (2, 4)) or items, "SPLIT": (128, 512, 32)}
        attrs = " __cluster_dims__(CL, 1, 1)"
        what = ("below SPLIT rows or for rows longer than a block holds, one row per cluster of CL blocks (sm_90), "
                "partial reductions combined through distributed shared memory; else as rows/block")
    if cluster or online:
        # Two blocks of 512 per SM: at one (up to 128 registers) ptxas gave log_softmax's ITEMS=4
        # 72 registers, one 512-thread block per SM, and the unsplit cluster path ran at 128-164%
        # of rows/block's time on many rows (H200, codegen-probe-h200); at two, ITEMS of 4 and
        # 2 compile in 64 registers without spills (8 spills: not in these grids). The bare bound
        # lets ptxas cap these at 32 registers and spill.
        bound = "512, 2"
    name = f"rows/{mode}" + ("+online" if online else "")
    what += "; max and sum of exp(x - max) in one pass" if online else ""
    head = header(grid, block, tune, f"{name}: {what}; ITEMS vectors per thread kept in registers between passes, "
                   "fp32 accumulation", spec)
    return Schedule(f"codegen:{name}", head + "\n".join(text) + "\n" + entry(spec, bound, em.vector_ok(outputs), call, attrs))
