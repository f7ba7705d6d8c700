// Plain compile error: calls a silu() helper that exists in PyTorch, not in CUDA. The log
// must name the identifier and the line so the author can fix it.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        const float u = static_cast<float>(x[token * 2 * d + d + i]);
        out[token * d + i] = static_cast<scalar_t>(silu(g) * u);
    }
}
