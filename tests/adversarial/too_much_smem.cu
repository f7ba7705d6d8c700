// Resource error: stages gate and up of ROWS tokens per block in fp32 shared memory,
// ROWS * 2 * d * 4 bytes = 64 * d: 704 KB for d = 11008, three times the 227 KB a block
// may have on an H100/H200.
// launch: grid=(cdiv(num_tokens, 8),) block=(256,) smem=8 * 2 * d * 4

#define ROWS 8

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    extern __shared__ float stage[];
    const long long first = static_cast<long long>(blockIdx.x) * ROWS;
    for (int r = 0; r < ROWS && first + r < num_tokens; ++r) {
        for (int i = threadIdx.x; i < 2 * d; i += blockDim.x) {
            stage[r * 2 * d + i] = static_cast<float>(x[(first + r) * 2 * d + i]);
        }
    }
    __syncthreads();
    for (int r = 0; r < ROWS && first + r < num_tokens; ++r) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            const float g = stage[r * 2 * d + i];
            out[(first + r) * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * stage[r * 2 * d + d + i]);
        }
    }
}
