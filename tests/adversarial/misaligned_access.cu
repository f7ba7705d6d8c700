// Fault (misaligned access): 16-byte vector loads that start one element into the row (the
// first element was meant to be handled separately), so every uint4 load is 2 bytes off its
// 16-byte boundary.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define VEC 8

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    const scalar_t* gate = x + token * 2 * d + 1;
    scalar_t* dst = out + token * d + 1;
    for (int c = threadIdx.x * VEC; c + VEC < d; c += blockDim.x * VEC) {
        const uint4 graw = *reinterpret_cast<const uint4*>(gate + c);
        const uint4 uraw = *reinterpret_cast<const uint4*>(gate + d + c);
        const scalar_t* g = reinterpret_cast<const scalar_t*>(&graw);
        const scalar_t* u = reinterpret_cast<const scalar_t*>(&uraw);
        for (int k = 0; k < VEC; ++k) {
            const float gv = static_cast<float>(g[k]);
            dst[c + k] = static_cast<scalar_t>(gv / (1.0f + expf(-gv)) * static_cast<float>(u[k]));
        }
    }
}
