// ${kernel}: ${what}
// Recipe layer_norm/rows: one block per row, sized so that each thread caches CACHE 16-byte
// vectors of the row in registers; the mean and then the variance around the mean are two
// reductions over those registers (warp shuffles and one barrier each), so the row is read
// from memory once. The weight and bias loads are issued before the second reduction and
// overlap it. Rows longer than the cache read their tail again in each pass. A scalar path
// covers rows that are not a multiple of the vector width or unaligned pointers.
${header}
${guards}
// At most 512 threads (1024 for CACHE=1), so that the cache and the weight/bias vectors fit
// the registers the launch bounds leave.
#define MAX_THREADS (CACHE > 1 ? 512 : 1024)
${rowcommon}

// Sum over the block (one row); every thread gets it. Each reduction has its own partial
// sums, so the second cannot overwrite what a slow warp still reads of the first.
__device__ __forceinline__ float row_total(float s, float* partial) {
    s = warp_sum(s);
    const int lane = threadIdx.x & 31;
    if (lane == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    return warp_sum(lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.0f);
}

template <int V>
__device__ __forceinline__ float vec_sum(const Pack<V>& a) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < V; ++j) s += static_cast<float>(a.v[j]);
    return s;
}

template <int V>
__device__ __forceinline__ float vec_sq_dev(const Pack<V>& a, float mean) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const float d = static_cast<float>(a.v[j]) - mean;
        s += d * d;
    }
    return s;
}

template <int V>
__device__ __forceinline__ Pack<V> normed(const Pack<V>& a, const Pack<V>& w, const Pack<V>& b, float mean, float rstd) {
    Pack<V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const float y = (static_cast<float>(a.v[j]) - mean) * rstd * static_cast<float>(w.v[j]) + static_cast<float>(b.v[j]);
        o.v[j] = static_cast<scalar_t>(y);
    }
    return o;
}

template <int V>
__device__ __forceinline__ void norm_row(scalar_t* __restrict__ dst, const scalar_t* __restrict__ src,
                                         const scalar_t* __restrict__ weight, const scalar_t* __restrict__ bias,
                                         int hidden, float eps) {
    using P = Pack<V>;
    const int n = hidden / V;
    const int tx = threadIdx.x;
    const int nx = blockDim.x;
    const P* s = reinterpret_cast<const P*>(src);
    const P* w = reinterpret_cast<const P*>(weight);
    const P* b = reinterpret_cast<const P*>(bias);
    P* d = reinterpret_cast<P*>(dst);
    __shared__ float partials[2][32];
    P x[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int i = tx + k * nx;
        if (i < n) x[k] = s[i];
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        if (tx + k * nx < n) sum += vec_sum(x[k]);
    }
    for (int i = tx + CACHE * nx; i < n; i += nx) sum += vec_sum(s[i]);
    const float mean = row_total(sum, partials[0]) / static_cast<float>(hidden);
    // The weight and bias do not depend on the statistics: their loads overlap the reduction.
    P wv[CACHE], bv[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int i = tx + k * nx;
        if (i < n) {
            wv[k] = w[i];
            bv[k] = b[i];
        }
    }
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        if (tx + k * nx < n) sq += vec_sq_dev(x[k], mean);
    }
    for (int i = tx + CACHE * nx; i < n; i += nx) sq += vec_sq_dev(s[i], mean);
    const float rstd = rsqrtf(row_total(sq, partials[1]) / static_cast<float>(hidden) + eps);
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int i = tx + k * nx;
        if (i < n) d[i] = normed(x[k], wv[k], bv[k], mean, rstd);
    }
    for (int i = tx + CACHE * nx; i < n; i += nx) d[i] = normed(s[i], w[i], b[i], mean, rstd);
}

__device__ __forceinline__ void layer_norm(scalar_t* dst, const scalar_t* src, const scalar_t* weight,
                                           const scalar_t* bias, int rows, int hidden, float eps) {
    const long long off = static_cast<long long>(blockIdx.x) * hidden;
    const unsigned long long addr = reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src) |
                                    reinterpret_cast<unsigned long long>(weight) | reinterpret_cast<unsigned long long>(bias);
    // Uniform over the block, so both barriers are reached by every thread.
    if (hidden % VEC == 0 && (addr & 15) == 0) {
        norm_row<VEC>(dst + off, src + off, weight, bias, hidden, eps);
    } else {
        norm_row<1>(dst + off, src + off, weight, bias, hidden, eps);
    }
}

${entry}
