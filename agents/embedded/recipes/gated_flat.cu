// ${kernel}: out[t, i] = act(x[t, i]) * x[t, d + i], act computed in fp32 and rounded once.
// Recipe gated_act/flat: the [tokens, d] output is one flat range of 16-byte vectors
// (8 halves); each thread keeps ITEMS vectors of gate and up in flight before computing, so
// small and odd token counts still fill every SM. Index math is 32-bit whenever the vector
// count allows (a 64-bit division per vector costs more than the load it addresses). A
// scalar path covers d that is not a multiple of the vector width and pointers that are not
// 16-byte aligned.
${header}
${guards}
${common}
// The scalar path (rare) out of line: inline, the compiler laid it before the vector path, so
// every launch jumped over its code (nvdisasm, sm_90). The 64-bit vector path stays inline: out
// of line it cost 8 registers (63 -> 71 at BLOCK=512, ITEMS=4) for 0x100 bytes of layout.
__device__ __noinline__ void gated_flat_scalar(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                             int rows, int d) {
    const long long total = static_cast<long long>(rows) * d;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long r = i / d;
        const long long c = i - r * d;
        const float g = static_cast<float>(x[r * 2 * d + c]);
        const float u = static_cast<float>(x[r * 2 * d + d + c]);
        out[i] = static_cast<scalar_t>(act(g) * u);
    }
}

__device__ __forceinline__ void gated_flat(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                           int rows, int d) {
    const unsigned long long addr = reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(out);
    if (d % VEC == 0 && (addr & 15) == 0) {
        const long long per_row = d / VEC;
        const long long total = static_cast<long long>(rows) * per_row;
        // blockDim.x is BLOCK, or fewer on a launch too small to give every SM a block.
        const int nt = blockDim.x;
        const long long step = static_cast<long long>(gridDim.x) * nt * ITEMS;
        const long long start = static_cast<long long>(blockIdx.x) * nt * ITEMS + threadIdx.x;
        if (total + step < (1ll << 32)) {
            // Every index fits in 32 bits (any real launch): 32-bit division, a few instructions
            // where the 64-bit one takes dozens.
            const unsigned int n = static_cast<unsigned int>(total), pr = static_cast<unsigned int>(per_row);
            for (unsigned int first = static_cast<unsigned int>(start); first < n;
                 first += static_cast<unsigned int>(step)) {
                uint4 g[ITEMS], u[ITEMS];
#pragma unroll
                for (int k = 0; k < ITEMS; ++k) {
                    const unsigned int i = first + k * nt;
                    if (i < n) {
                        const unsigned int r = i / pr;
                        const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<long long>(r) * 2 * d) + (i - r * pr);
                        g[k] = load_vec(src);
                        u[k] = load_vec(src + pr);
                    }
                }
#pragma unroll
                for (int k = 0; k < ITEMS; ++k) {
                    const unsigned int i = first + k * nt;
                    if (i < n) store_vec(reinterpret_cast<uint4*>(out) + i, gate_times_up(g[k], u[k]));
                }
            }
            return;
        }
        for (long long first = start; first < total; first += step) {
            uint4 g[ITEMS], u[ITEMS];
#pragma unroll
            for (int k = 0; k < ITEMS; ++k) {
                const long long i = first + static_cast<long long>(k) * nt;
                if (i < total) {
                    const long long r = i / per_row;
                    const uint4* src = reinterpret_cast<const uint4*>(x + r * 2 * d) + (i - r * per_row);
                    g[k] = load_vec(src);
                    u[k] = load_vec(src + per_row);
                }
            }
#pragma unroll
            for (int k = 0; k < ITEMS; ++k) {
                const long long i = first + static_cast<long long>(k) * nt;
                if (i < total) store_vec(reinterpret_cast<uint4*>(out) + i, gate_times_up(g[k], u[k]));
            }
        }
        return;
    }
    gated_flat_scalar(out, x, rows, d);
}

${entry}
