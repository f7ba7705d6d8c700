// layernorm: out = (x - mean) * rsqrt(var + eps) * w + b per row, variance around the mean, fp32 math.
// Recipe layer_norm/rows: one block per row, sized so that each thread caches CACHE 16-byte
// vectors of the row in registers; the mean and then the variance around the mean are two
// reductions over those registers (warp shuffles and one barrier each), so the row is read
// from memory once. The weight and bias loads are issued with the row's. Rows longer than the
// cache read their tail again in each pass. A scalar path covers rows that are not a multiple
// of the vector width or unaligned pointers.
// The second pass also sums x - mean, which corrects the mean for its own rounding (and for
// fast-math division): a row offset far above its spread would otherwise leave a visible
// error in x - mean.
// launch: grid=(num_tokens,) block=(min(1024 // min(CACHE, 2), max(32, 32 * cdiv(hidden, 256 * CACHE))),) smem=0
// flags: --use_fast_math
// tune: CACHE=2,1,4
#ifndef CACHE
#define CACHE 2
#endif

// At most 512 threads (1024 for CACHE=1), so that the cache and the weight/bias vectors fit
// the registers the launch bounds leave.
#define MAX_THREADS (CACHE > 1 ? 512 : 1024)
constexpr int VEC = 16 / sizeof(scalar_t);

template <int V>
struct alignas(sizeof(scalar_t) * V) Pack {
    scalar_t v[V];
};

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

__device__ __forceinline__ float warp_max(float s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}


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

// Two sums over the block at once (the second pass: deviations and their squares).
__device__ __forceinline__ float2 row_total2(float2 s, float2* partial) {
    s.x = warp_sum(s.x);
    s.y = warp_sum(s.y);
    const int lane = threadIdx.x & 31;
    if (lane == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    const bool has = lane < static_cast<int>(blockDim.x >> 5);
    return make_float2(warp_sum(has ? partial[lane].x : 0.0f), warp_sum(has ? partial[lane].y : 0.0f));
}

// Adds the deviations from mean (x) and their squares (y).
template <int V>
__device__ __forceinline__ void vec_dev(const Pack<V>& a, float mean, float2& acc) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const float d = static_cast<float>(a.v[j]) - mean;
        acc.x += d;
        acc.y += d * d;
    }
}

template <int V>
__device__ __forceinline__ Pack<V> normed(const Pack<V>& a, const Pack<V>& w, const Pack<V>& b, float mean0,
                                          float delta, float rstd) {
    Pack<V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
        // x - mean0 first (near-exact for x near the mean), then the small correction.
        const float d = (static_cast<float>(a.v[j]) - mean0) - delta;
        const float y = d * rstd * static_cast<float>(w.v[j]) + static_cast<float>(b.v[j]);
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
    __shared__ float partial_sum[32];
    __shared__ float2 partial_dev[32];
    // The weight and bias do not depend on the row: their loads go out with the row's, so a
    // short row waits for one round trip to memory, not one per reduction.
    P x[CACHE], wv[CACHE], bv[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int i = tx + k * nx;
        if (i < n) {
            x[k] = s[i];
            wv[k] = w[i];
            bv[k] = b[i];
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        if (tx + k * nx < n) sum += vec_sum(x[k]);
    }
    #pragma unroll 4
    for (int i = tx + CACHE * nx; i < n; i += nx) sum += vec_sum(s[i]);
    const float mean0 = row_total(sum, partial_sum) / static_cast<float>(hidden);
    float2 dev = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        if (tx + k * nx < n) vec_dev(x[k], mean0, dev);
    }
    #pragma unroll 4
    for (int i = tx + CACHE * nx; i < n; i += nx) vec_dev(s[i], mean0, dev);
    dev = row_total2(dev, partial_dev);
    // sum((x - mean0)^2) / n - delta^2: the variance around the corrected mean mean0 + delta.
    const float delta = dev.x / static_cast<float>(hidden);
    const float var = fmaxf(dev.y / static_cast<float>(hidden) - delta * delta, 0.0f);
    const float rstd = rsqrtf(var + eps);
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int i = tx + k * nx;
        if (i < n) d[i] = normed(x[k], wv[k], bv[k], mean0, delta, rstd);
    }
    #pragma unroll 4
    for (int i = tx + CACHE * nx; i < n; i += nx) d[i] = normed(s[i], w[i], b[i], mean0, delta, rstd);
}

// The scalar path (rows off vector boundaries, unaligned pointers: rare) out of line: inline,
// the compiler laid it before the vector path, so every launch jumped over its code
// (nvdisasm, sm_90).
__device__ __noinline__ void norm_row_scalar(scalar_t* __restrict__ dst, const scalar_t* __restrict__ src,
                                        const scalar_t* __restrict__ weight, const scalar_t* __restrict__ bias,
                                        int hidden, float eps) {
    norm_row<1>(dst, src, weight, bias, hidden, eps);
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
        norm_row_scalar(dst + off, src + off, weight, bias, hidden, eps);
    }
}

extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1) layernorm(
    scalar_t* __restrict__ out,
    const scalar_t* __restrict__ input,
    const scalar_t* __restrict__ weight,
    const scalar_t* __restrict__ bias,
    int num_tokens,
    int hidden,
    float eps) {
    layer_norm(out, input, weight, bias, num_tokens, hidden, eps);
}

