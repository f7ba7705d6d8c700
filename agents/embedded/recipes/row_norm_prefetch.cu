// ${kernel}: ${what}
// Recipe row_norm/${variant}: ${layout}
// Small rows are bound by memory latency, not bandwidth, so every load of the cached part of
// the row and of the weight is issued before the first use of any: one round trip to memory
// per pass instead of one per vector. Each thread caches CACHE 16-byte vectors of the row in
// registers between the passes. Longer rows go on in chunks of CHUNK vectors per thread,
// loads again first; the second pass of such a tail re-reads only what this thread wrote.
// HINT picks the cache path (stream_common.cu) of the cached part of the row and of every final
// store; the weight and the tail the second pass re-reads stay plain. A scalar path covers
// rows that are not a multiple of the vector width or unaligned pointers.
${header}
${guards}
#define FUSED ${fused}
#define GEMMA ${gemma}
#define WARP_ROW ${warp_row}
#if WARP_ROW
#define MAX_THREADS (32 * ROWS)
#else
// At most 512 threads, so that 128 registers per thread hold the cache and the tail chunk.
#define MAX_THREADS (CACHE > 4 ? 4096 / CACHE : 512)
#endif
${rowcommon}
${streamcommon}
// Vectors per thread in flight at once in the tail of rows longer than the cache.
constexpr int CHUNK = WARP_ROW ? 4 : 2;

// Sum over the threads of one row; every thread gets it.
__device__ __forceinline__ float row_total(float s) {
    s = warp_sum(s);
#if !WARP_ROW
    // blockDim.x threads per row (a multiple of 32), blockDim.y rows per block: one barrier,
    // then every warp reduces its row's partials itself.
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31;
    const int warps = static_cast<int>(blockDim.x >> 5);
    if (lane == 0) partial[threadIdx.y * warps + (threadIdx.x >> 5)] = s;
    __syncthreads();
    s = warp_sum(lane < warps ? partial[threadIdx.y * warps + lane] : 0.0f);
#endif
    return s;
}

__device__ __forceinline__ float scale_of(float w) {
#if GEMMA
    return 1.0f + w;
#else
    return w;
#endif
}

// Two floats to two scalar_t with one paired conversion (fewer registers and instructions
// than two scalar ones, which matters for bf16).
__device__ __forceinline__ void store2(__half* p, float a, float b) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

template <int V>
__device__ __forceinline__ void round_into(Pack<V>& o, const float (&f)[V]) {
    if constexpr (V % 2 == 0) {
#pragma unroll
        for (int j = 0; j < V; j += 2) store2(&o.v[j], f[j], f[j + 1]);
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) o.v[j] = static_cast<scalar_t>(f[j]);
    }
}

// x = a (+ b) in fp32; adds the unrounded x^2 to ss and returns x rounded to scalar_t
// (for the fused kernel that is the new residual; otherwise it is a itself, exactly).
template <int V>
__device__ __forceinline__ Pack<V> combine(const Pack<V>& a, const Pack<V>& b, float& ss) {
    float f[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
        f[j] = static_cast<float>(a.v[j]);
#if FUSED
        f[j] += static_cast<float>(b.v[j]);
#endif
        ss += f[j] * f[j];
    }
    Pack<V> x;
    round_into(x, f);
    return x;
}

template <int V>
__device__ __forceinline__ Pack<V> scaled(const Pack<V>& x, const Pack<V>& w, float r) {
    float f[V];
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = static_cast<float>(x.v[j]) * r * scale_of(static_cast<float>(w.v[j]));
    Pack<V> o;
    round_into(o, f);
    return o;
}

// First pass over the part of the row past the register cache; returns its sum of squares.
template <int V>
__device__ __forceinline__ float tail_sum(const Pack<V>* s, Pack<V>* r, int n, int first, int nx) {
    float ss = 0.0f;
    for (int base = first; base < n; base += CHUNK * nx) {
        Pack<V> a[CHUNK], b[CHUNK];
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) {
            const int i = base + c * nx;
            if (i < n) {
                a[c] = s[i];
                b[c] = FUSED ? r[i] : a[c];
            }
        }
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) {
            const int i = base + c * nx;
            if (i < n) {
                const Pack<V> x = combine(a[c], b[c], ss);
                if (FUSED) r[i] = x;
            }
        }
    }
    return ss;
}

// Second pass over that part: x is the rounded residual this thread stored (fused) or the input.
template <int V>
__device__ __forceinline__ void tail_store(Pack<V>* d, const Pack<V>* x_src, const Pack<V>* __restrict__ w,
                                           int n, int first, int nx, float rr) {
    for (int base = first; base < n; base += CHUNK * nx) {
        Pack<V> a[CHUNK], b[CHUNK];
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) {
            const int i = base + c * nx;
            if (i < n) {
                a[c] = x_src[i];
                b[c] = w[i];
            }
        }
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) {
            const int i = base + c * nx;
            if (i < n) store_vec(d + i, scaled(a[c], b[c], rr));
        }
    }
}

// dst and src are the same row for the fused kernel (in place): not __restrict__. Every read
// of an element comes before its write, in program order, so the aliasing is harmless.
template <int V>
__device__ __forceinline__ void norm_row(scalar_t* dst, scalar_t* res, const scalar_t* src,
                                         const scalar_t* __restrict__ weight, int hidden, float eps) {
    using P = Pack<V>;
    const int n = hidden / V;
    const int tx = threadIdx.x;
    const int nx = blockDim.x;
    const P* s = reinterpret_cast<const P*>(src);
    P* r = reinterpret_cast<P*>(res);
    P* d = reinterpret_cast<P*>(dst);
    const P* w = reinterpret_cast<const P*>(weight);
    P x[CACHE], y[CACHE], wv[CACHE];
    // The weight does not depend on the row: its loads go out with the row's, so a short row
    // costs one round trip to memory before the reduction, not two.
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int i = tx + k * nx;
        if (i < n) {
            x[k] = load_vec(s + i);  // the row: read once (HINT), the weight: plain
            y[k] = FUSED ? load_vec(r + i) : x[k];
            wv[k] = w[i];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int i = tx + k * nx;
        if (i < n) {
            x[k] = combine(x[k], y[k], ss);
            if (FUSED) store_vec(r + i, x[k]);
        }
    }
    ss += tail_sum<V>(s, r, n, tx + CACHE * nx, nx);
    const float rr = rsqrtf(row_total(ss) / static_cast<float>(hidden) + eps);
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int i = tx + k * nx;
        if (i < n) store_vec(d + i, scaled(x[k], wv[k], rr));
    }
    tail_store<V>(d, FUSED ? r : s, w, n, tx + CACHE * nx, nx, rr);
}

// The scalar path (rows off vector boundaries, unaligned pointers: rare) out of line: inline,
// the compiler laid it before the vector path, so every launch jumped over its code
// (nvdisasm, sm_90).
__device__ __noinline__ void norm_row_scalar(scalar_t* dst, scalar_t* res, const scalar_t* src,
                                        const scalar_t* __restrict__ weight, int hidden, float eps) {
    norm_row<1>(dst, res, src, weight, hidden, eps);
}

#if !WARP_ROW
// The threads of a row past the end (a block's last rows) join the reduction's one barrier and
// do nothing else; out of line, so that the active path is the one laid after the entry.
__device__ __noinline__ void idle_row() { row_total(0.0f); }
#endif

__device__ __forceinline__ void row_norm(scalar_t* dst, scalar_t* res, const scalar_t* src, const scalar_t* weight,
                                         int rows, int hidden, float eps) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
#if WARP_ROW
    if (row >= rows) return;  // a whole warp: no barrier follows
#else
    // Short rows share a block (blockDim.y rows); the threads of a row past the end only
    // take part in the reduction's one barrier.
    const bool active = row < rows;
#endif
    const long long off = static_cast<long long>(row) * hidden;
    const unsigned long long addr = reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src) |
                                    reinterpret_cast<unsigned long long>(res) | reinterpret_cast<unsigned long long>(weight);
    scalar_t* res_row = FUSED ? res + off : nullptr;
#if !WARP_ROW
    if (__builtin_expect(!active, 0)) {
        idle_row();
        return;
    }
#endif
    // Uniform over the row's threads, so the barrier in row_total is reached by all of them.
    // Expected false, so that the vector path is the one laid straight after the entry.
    if (__builtin_expect(hidden % VEC != 0 || (addr & 15) != 0, 0)) {
        norm_row_scalar(dst + off, res_row, src + off, weight, hidden, eps);
        return;
    }
    norm_row<VEC>(dst + off, res_row, src + off, weight, hidden, eps);
}

${entry}
