// Resource error (binary): a 20 MiB initialised __device__ table makes a 20 MiB cubin that
// would fill the compile cache and travel through Ray with every trial.
// launch: grid=(num_tokens,) block=(256,) smem=0

__device__ unsigned char table[20 << 20] = {1, 2, 3};

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        out[token * d + i] = static_cast<scalar_t>(table[i] * 0.0f + g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + i]));
    }
}
