// Resource error (shared memory): asks for d * d * d * d bytes of dynamic shared memory, an
// absurd size (2^64 and more) that must be refused as a number, never overflow a C integer.
// launch: grid=(num_tokens,) block=(256,) smem=d * d * d * d * d

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + i]));
    }
}
