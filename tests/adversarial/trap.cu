// Fault (trap): asserts an alignment assumption with __trap(); d = 11008 breaks it, so the
// kernel aborts on the first search shape.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    if (d % 4096 != 0) {
        __trap();
    }
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        const float u = static_cast<float>(x[token * 2 * d + d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u);
    }
}
