// bias_gelu baseline: out[t, i] = gelu(x[t, i] + bias[i]), exact erf GELU in fp32.
// The straightforward first kernel: one block per token, threads striding over the row,
// scalar loads and stores.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void bias_gelu(scalar_t* out, const scalar_t* x, const scalar_t* bias,
                                     int num_tokens, int hidden) {
    const long long row = blockIdx.x;
    const scalar_t* src = x + row * hidden;
    scalar_t* dst = out + row * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(src[i]) + static_cast<float>(bias[i]);
        dst[i] = static_cast<scalar_t>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
    }
}
