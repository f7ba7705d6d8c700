// Resource error: 2048 threads per block (one per pair of elements of a 4096-wide row), twice
// the hardware limit of 1024.
// launch: grid=(num_tokens,) block=(2048,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        const float u = static_cast<float>(x[token * 2 * d + d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u);
    }
}
