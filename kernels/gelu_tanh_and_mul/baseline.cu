// gelu_tanh_and_mul baseline: out[t, i] = gelu_tanh(x[t, i]) * x[t, d + i], computed in fp32.
// The straightforward first kernel: one block per token, threads striding over the row,
// scalar loads and stores, tanhf.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void gelu_tanh_and_mul(scalar_t* out, const scalar_t* x, int num_tokens,
                                             int d) {
    const long long token = blockIdx.x;
    const scalar_t* gate = x + token * 2 * d;
    const scalar_t* up = gate + d;
    scalar_t* dst = out + token * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(gate[i]);
        const float u = static_cast<float>(up[i]);
        const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        const float gelu = 0.5f * g * (1.0f + tanhf(inner));
        dst[i] = static_cast<scalar_t>(gelu * u);
    }
}
