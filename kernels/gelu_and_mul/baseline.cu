// gelu_and_mul baseline: out[t, i] = gelu(x[t, i]) * x[t, d + i] with the exact erf gelu,
// computed in fp32. The straightforward first kernel: one block per token, threads striding
// over the row, scalar loads and stores, erff.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void gelu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    const scalar_t* gate = x + token * 2 * d;
    const scalar_t* up = gate + d;
    scalar_t* dst = out + token * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(gate[i]);
        const float u = static_cast<float>(up[i]);
        const float gelu = 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
        dst[i] = static_cast<scalar_t>(gelu * u);
    }
}
