// ${kernel}: out[t, i] = act(x[t, i]) * x[t, d + i], act computed in fp32 and rounded once.
// Recipe gated_act/tiles: each block owns one tile of blockDim.x * ITEMS 16-byte vectors of a row
// (blockDim.x is BLOCK, or fewer on a launch too small to give every SM a block):
// the tile is blockIdx.x, the row blockIdx.y (a 2-D grid, so no thread divides to find its
// place; rows past grid.y's 65535 are taken in turn by the same blocks). Every thread issues
// all its gate and up loads before the first store. A scalar path covers d that is not a
// multiple of the vector width and pointers that are not 16-byte aligned.
${header}
${guards}
${common}
// Paths off the common case are __noinline__ functions: inline, the compiler laid them
// before the vector path, so every launch jumped over their code (nvdisasm, sm_90).
__device__ __noinline__ void gated_tiles_scalar(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                              int rows, int d) {
    // Scalar path: the same blocks, read as a flat range (block (x, y) is block y * grid.x + x).
    const long long total = static_cast<long long>(rows) * d;
    const long long step = static_cast<long long>(gridDim.x) * gridDim.y * blockDim.x;
    const long long block = static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x;
    for (long long i = block * blockDim.x + threadIdx.x; i < total; i += step) {
        const long long r = i / d;
        const long long c = i - r * d;
        const float g = static_cast<float>(x[r * 2 * d + c]);
        const float u = static_cast<float>(x[r * 2 * d + d + c]);
        out[i] = static_cast<scalar_t>(act(g) * u);
    }
}

// One row's tile: every gate and up load issued before the first store.
__device__ __forceinline__ void gated_tile_row(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                               int d, int per_row, int first, int nt, int row) {
    const uint4* g16 = reinterpret_cast<const uint4*>(x + static_cast<long long>(row) * 2 * d);
    const uint4* u16 = g16 + per_row;
    uint4* o16 = reinterpret_cast<uint4*>(out + static_cast<long long>(row) * d);
    uint4 g[ITEMS], u[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        if (first + k * nt < per_row) {
            g[k] = load_vec(g16 + first + k * nt);
            u[k] = load_vec(u16 + first + k * nt);
        }
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        if (first + k * nt < per_row) {
            store_vec(o16 + first + k * nt, gate_times_up(g[k], u[k]));
        }
    }
}

// Rows past grid.y (more than 65535 tokens), taken in turn after the block's own row.
__device__ __noinline__ void gated_tiles_later_rows(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                                    int rows, int d, int per_row, int first, int nt) {
    for (int row = blockIdx.y + gridDim.y; row < rows; row += gridDim.y) {
        gated_tile_row(out, x, d, per_row, first, nt, row);
    }
}

__device__ __forceinline__ void gated_tiles(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                            int rows, int d) {
    const unsigned long long addr = reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(out);
    // The grid counts tiles of 8-element vectors (2-byte types); other types take the scalar path.
    // Expected false, so that the vector path is the one laid straight after the entry.
    if (__builtin_expect(!(VEC == 8 && d % VEC == 0 && (addr & 15) == 0), 0)) {
        gated_tiles_scalar(out, x, rows, d);
        return;
    }
    const int per_row = d / VEC;
    const int nt = blockDim.x;
    const int first = blockIdx.x * nt * ITEMS + threadIdx.x;
    // The block's own row (grid.y never exceeds the rows) with no loop around it: a loop put a
    // test and a branch between the entry and the first load of every block.
    gated_tile_row(out, x, d, per_row, first, nt, blockIdx.y);
    if (rows > static_cast<int>(gridDim.y)) {
        gated_tiles_later_rows(out, x, rows, d, per_row, first, nt);
    }
}

${entry}
