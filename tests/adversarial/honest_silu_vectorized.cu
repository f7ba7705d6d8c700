// Honest fast silu_and_mul: a flat grid over 8-element (16-byte) vectors of the output, so
// that even one token spreads over many blocks; fp32 math with __expf and a correctly
// rounded reciprocal. Scalar fallback when d is not a multiple of 8 (the up half would not
// be 16-byte aligned).
// launch: grid=(cdiv(num_tokens * d, 8 * BLOCK),) block=(BLOCK,) smem=0
// tune: BLOCK=256,128,512

#define VEC 8

__device__ __forceinline__ float silu_times(float g, float u) {
    // 1 + e^-g overflows to inf for g < -88: the reciprocal is then 0 and the product -0.
    return g * __frcp_rn(1.0f + __expf(-g)) * u;
}

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long total = static_cast<long long>(num_tokens) * d;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (d % VEC == 0) {
        const long long row_vecs = d / VEC;
        for (long long v = first; v < total / VEC; v += stride) {
            const long long token = v / row_vecs;
            const long long col = (v - token * row_vecs) * VEC;
            const scalar_t* gate = x + token * 2 * d + col;
            const uint4 graw = *reinterpret_cast<const uint4*>(gate);
            const uint4 uraw = *reinterpret_cast<const uint4*>(gate + d);
            const scalar_t* g = reinterpret_cast<const scalar_t*>(&graw);
            const scalar_t* u = reinterpret_cast<const scalar_t*>(&uraw);
            alignas(16) scalar_t r[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                r[k] = static_cast<scalar_t>(silu_times(static_cast<float>(g[k]), static_cast<float>(u[k])));
            }
            *reinterpret_cast<uint4*>(out + token * d + col) = *reinterpret_cast<const uint4*>(r);
        }
    } else {
        for (long long i = first; i < total; i += stride) {
            const long long token = i / d;
            const long long col = i - token * d;
            const float g = static_cast<float>(x[token * 2 * d + col]);
            const float u = static_cast<float>(x[token * 2 * d + d + col]);
            out[i] = static_cast<scalar_t>(silu_times(g, u));
        }
    }
}
