// Fault (hang): a hand-made grid barrier whose target is off by one (gridDim.x + 1 arrivals
// for gridDim.x blocks), so every block spins forever.
// launch: grid=(num_tokens,) block=(256,) smem=0

__device__ unsigned int g_arrived;

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    if (threadIdx.x == 0) {
        atomicAdd(&g_arrived, 1u);
        while (atomicAdd(&g_arrived, 0u) < gridDim.x + 1) {
        }
    }
    __syncthreads();
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        const float u = static_cast<float>(x[token * 2 * d + d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u);
    }
}
