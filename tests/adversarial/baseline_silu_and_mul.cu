// Copy of kernels/silu_and_mul/baseline.cu: a variant identical in code to the baseline must pass (speedup ~1).
// silu_and_mul baseline: out[t, i] = silu(x[t, i]) * x[t, d + i], computed in fp32.
// The straightforward first kernel: one block per token, threads striding over the row,
// scalar loads and stores, expf.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    const scalar_t* gate = x + token * 2 * d;
    const scalar_t* up = gate + d;
    scalar_t* dst = out + token * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(gate[i]);
        const float u = static_cast<float>(up[i]);
        const float silu = g / (1.0f + expf(-g));
        dst[i] = static_cast<scalar_t>(silu * u);
    }
}
