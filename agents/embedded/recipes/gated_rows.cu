// ${kernel}: out[t, i] = act(x[t, i]) * x[t, d + i], act computed in fp32 and rounded once.
// Recipe gated_act/rows: one block per token as in the production kernels, threads stride
// over the row in 16-byte vectors (8 halves) with ITEMS vectors in flight per thread; a
// scalar path covers d that is not a multiple of the vector width or unaligned pointers.
${header}
${guards}
${common}
// Paths off the common case are __noinline__ functions: inline, the compiler laid them
// before the vector path, so every launch jumped over their code (nvdisasm, sm_90).
__device__ __noinline__ void gated_rows_scalar(scalar_t* __restrict__ dst, const scalar_t* __restrict__ gate, int d) {
    for (int i = threadIdx.x; i < d; i += BLOCK) {
        dst[i] = static_cast<scalar_t>(act(static_cast<float>(gate[i])) * static_cast<float>(gate[d + i]));
    }
}

__device__ __forceinline__ void gated_rows(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                           int rows, int d) {
    const long long row = blockIdx.x;
    const scalar_t* gate = x + row * 2 * d;
    scalar_t* dst = out + row * d;
    const unsigned long long addr = reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(out);
    if (d % VEC == 0 && (addr & 15) == 0) {
        const int per_row = d / VEC;
        const uint4* g16 = reinterpret_cast<const uint4*>(gate);
        const uint4* u16 = reinterpret_cast<const uint4*>(gate + d);
        uint4* o16 = reinterpret_cast<uint4*>(dst);
        for (int first = threadIdx.x; first < per_row; first += BLOCK * ITEMS) {
            uint4 g[ITEMS], u[ITEMS];
#pragma unroll
            for (int k = 0; k < ITEMS; ++k) {
                if (first + k * BLOCK < per_row) {
                    g[k] = load_vec(g16 + first + k * BLOCK);
                    u[k] = load_vec(u16 + first + k * BLOCK);
                }
            }
#pragma unroll
            for (int k = 0; k < ITEMS; ++k) {
                if (first + k * BLOCK < per_row) {
                    store_vec(o16 + first + k * BLOCK, gate_times_up(g[k], u[k]));
                }
            }
        }
        return;
    }
    gated_rows_scalar(dst, gate, d);
}

${entry}
