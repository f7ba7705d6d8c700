// Cheat (unordered reduction): every thread adds each x^2 straight into one shared float
// with atomicAdd, so the order of the fp32 additions follows warp scheduling and changes
// from launch to launch. Each result is within tolerance, but two launches on the same
// inputs give different bits, which a deterministic reference never does.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void fused_add_rmsnorm(scalar_t* input, scalar_t* residual, const scalar_t* weight,
                                             int num_tokens, int hidden, float eps) {
    __shared__ float sum_sq;
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    scalar_t* in_row = input + row;
    scalar_t* res_row = residual + row;
    if (threadIdx.x == 0) {
        sum_sq = 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float x = static_cast<float>(in_row[i]) + static_cast<float>(res_row[i]);
        res_row[i] = static_cast<scalar_t>(x);
        atomicAdd(&sum_sq, x * x);
    }
    __syncthreads();
    const float r = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        in_row[i] = static_cast<scalar_t>(static_cast<float>(res_row[i]) * r * static_cast<float>(weight[i]));
    }
}
