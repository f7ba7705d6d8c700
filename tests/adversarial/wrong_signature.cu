// Broken contract (signature): drops num_tokens because the grid already has one block per
// token. The harness passes the spec's four arguments, so d would land in num_tokens' slot.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        const float u = static_cast<float>(x[token * 2 * d + d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u);
    }
}
