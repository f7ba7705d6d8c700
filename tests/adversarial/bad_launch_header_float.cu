// Broken contract (launch header): a float in the grid expression (two tokens per block
// written as num_tokens * 0.5). Launch sizes are integers; use cdiv(num_tokens, 2).
// launch: grid=(num_tokens * 0.5,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        const float u = static_cast<float>(x[token * 2 * d + d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u);
    }
}
