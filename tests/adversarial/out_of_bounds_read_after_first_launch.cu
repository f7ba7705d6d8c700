// Latent bug (out-of-bounds read from the second launch on): the first launch sets a device
// flag, after which every thread also prefetches the next weight element, which for the last
// element lies just past the end of weight. The prefetched value is never used, so
// outputs are right; a sanitizer that watches only the first launch sees nothing.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256

__device__ int warmed_up;

extern "C" __global__ void fused_add_rmsnorm(scalar_t* input, scalar_t* residual, const scalar_t* weight,
                                             int num_tokens, int hidden, float eps) {
    __shared__ float partial[THREADS];
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    scalar_t* in_row = input + row;
    scalar_t* res_row = residual + row;
    const bool prefetch = warmed_up != 0;

    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float x = static_cast<float>(in_row[i]) + static_cast<float>(res_row[i]);
        res_row[i] = static_cast<scalar_t>(x);
        sum_sq += x * x;
    }
    partial[threadIdx.x] = sum_sq;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    const float r = rsqrtf(partial[0] / static_cast<float>(hidden) + eps);

    float ahead = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        if (prefetch) ahead += static_cast<float>(weight[i + 1]);  // past the end for i = hidden - 1
        const float x = static_cast<float>(res_row[i]);
        in_row[i] = static_cast<scalar_t>(x * r * static_cast<float>(weight[i]));
    }
    if (ahead == 12345.678f) partial[0] = ahead;  // keeps the prefetch from being optimised away
    if (blockIdx.x == 0 && threadIdx.x == 0) warmed_up = 1;
}
