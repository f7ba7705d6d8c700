// Cheat (NaN as a wildcard): skips the saturated range |gate| > 4 and writes NaN there,
// hoping that the comparison treats NaN as "matches anything" (equal_nan, or NaN
// comparisons that are never true and so never flag).
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    const scalar_t* gate = x + token * 2 * d;
    const scalar_t* up = gate + d;
    scalar_t* dst = out + token * d;
    const float nan = __int_as_float(0x7fffffff);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(gate[i]);
        const float r = fabsf(g) > 4.0f ? nan : g / (1.0f + expf(-g)) * static_cast<float>(up[i]);
        dst[i] = static_cast<scalar_t>(r);
    }
}
