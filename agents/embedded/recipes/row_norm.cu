// ${kernel}: ${what}
// Recipe row_norm: ROWS rows per block (block.y), each row handled by blockDim.x threads
// sized to the row. Loads are 16-byte vectors; each thread keeps its first ITEMS vectors of
// the row in registers between the two passes, so the second pass reads only the weight.
// The sum of squares is reduced by warp shuffles and one cross-warp step. A scalar path
// covers rows that are not a multiple of the vector width or unaligned pointers.
${header}
${guards}
#define FUSED ${fused}
#define GEMMA ${gemma}
#define MAX_THREADS (ITEMS > 4 ? 4096 / ITEMS : 1024)
${rowcommon}

// Sum over the blockDim.x threads of one row slice (threadIdx.y); every thread gets it.
__device__ __forceinline__ float row_sum(float s) {
    __shared__ float partial[ROWS][32];
    s = warp_sum(s);
    const int lane = threadIdx.x & 31;
    if (lane == 0) partial[threadIdx.y][threadIdx.x >> 5] = s;
    __syncthreads();
    // Every warp reduces the partial sums itself: no second barrier and no broadcast.
    const float t = lane < static_cast<int>(blockDim.x >> 5) ? partial[threadIdx.y][lane] : 0.0f;
    return warp_sum(t);
}

__device__ __forceinline__ float scale_of(float w) {
#if GEMMA
    return 1.0f + w;
#else
    return w;
#endif
}

// dst and src are the same row for the fused kernel (in place), so they are not __restrict__.
template <int V>
__device__ __forceinline__ void norm_row(scalar_t* dst, scalar_t* res, const scalar_t* src,
                                         const scalar_t* __restrict__ weight,
                                         bool active, int hidden, float eps) {
    using P = Pack<V>;
    const int n = hidden / V;
    const int tx = threadIdx.x;
    const int nx = blockDim.x;
    float keep[ITEMS][V];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = tx + k * nx;
        if (active && i < n) {
            P a = reinterpret_cast<const P*>(src)[i];
#if FUSED
            P b = reinterpret_cast<const P*>(res)[i];
#endif
#pragma unroll
            for (int j = 0; j < V; ++j) {
                float x = static_cast<float>(a.v[j]);
#if FUSED
                x += static_cast<float>(b.v[j]);
                b.v[j] = static_cast<scalar_t>(x);
#endif
                keep[k][j] = x;
                ss += x * x;
            }
#if FUSED
            reinterpret_cast<P*>(res)[i] = b;
#endif
        }
    }
    // Rows longer than the registers hold: the rest is read again in the second pass.
    for (int i = tx + ITEMS * nx; active && i < n; i += nx) {
        P a = reinterpret_cast<const P*>(src)[i];
#if FUSED
        P b = reinterpret_cast<const P*>(res)[i];
#endif
#pragma unroll
        for (int j = 0; j < V; ++j) {
            float x = static_cast<float>(a.v[j]);
#if FUSED
            x += static_cast<float>(b.v[j]);
            b.v[j] = static_cast<scalar_t>(x);
#endif
            ss += x * x;
        }
#if FUSED
        reinterpret_cast<P*>(res)[i] = b;
#endif
    }
    const float r = rsqrtf(row_sum(ss) / static_cast<float>(hidden) + eps);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = tx + k * nx;
        if (active && i < n) {
            const P w = reinterpret_cast<const P*>(weight)[i];
            P o;
#pragma unroll
            for (int j = 0; j < V; ++j) o.v[j] = static_cast<scalar_t>(keep[k][j] * r * scale_of(static_cast<float>(w.v[j])));
            reinterpret_cast<P*>(dst)[i] = o;
        }
    }
    for (int i = tx + ITEMS * nx; active && i < n; i += nx) {
#if FUSED
        const P a = reinterpret_cast<const P*>(res)[i];  // this thread's own rounded sum
#else
        const P a = reinterpret_cast<const P*>(src)[i];
#endif
        const P w = reinterpret_cast<const P*>(weight)[i];
        P o;
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = static_cast<scalar_t>(static_cast<float>(a.v[j]) * r * scale_of(static_cast<float>(w.v[j])));
        reinterpret_cast<P*>(dst)[i] = o;
    }
}

// The scalar path (rows off vector boundaries, unaligned pointers: rare) out of line: inline,
// the compiler laid it before the vector path, so every launch jumped over its code
// (nvdisasm, sm_90).
__device__ __noinline__ void norm_row_scalar(scalar_t* dst, scalar_t* res, const scalar_t* src,
                                        const scalar_t* __restrict__ weight, bool active, int hidden, float eps) {
    norm_row<1>(dst, res, src, weight, active, hidden, eps);
}

__device__ __forceinline__ void row_norm(scalar_t* dst, scalar_t* res, const scalar_t* src, const scalar_t* weight,
                                         int rows, int hidden, float eps) {
    const int row = blockIdx.x * ROWS + threadIdx.y;
    // Threads of a missing last row still take part in the block-wide barrier.
    const bool active = row < rows;
    const long long off = static_cast<long long>(active ? row : 0) * hidden;
    const unsigned long long addr = reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src) |
                                    reinterpret_cast<unsigned long long>(res) | reinterpret_cast<unsigned long long>(weight);
    scalar_t* res_row = FUSED ? res + off : nullptr;
    if (hidden % VEC == 0 && (addr & 15) == 0) {
        norm_row<VEC>(dst + off, res_row, src + off, weight, active, hidden, eps);
    } else {
        norm_row_scalar(dst + off, res_row, src + off, weight, active, hidden, eps);
    }
}

${entry}
