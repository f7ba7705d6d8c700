// Copy of kernels/fused_add_rmsnorm/baseline.cu: a variant identical in code to the baseline must pass (speedup ~1).
// fused_add_rmsnorm baseline: x = input + residual; residual <- x; input <- x * rsqrt(mean(x^2) + eps) * weight.
// The straightforward first kernel: one block of 256 threads per row, threads striding over
// the row with scalar loads, a shared-memory tree reduction of the fp32 sum of squares, and
// a second pass over global memory that reads the residual back.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256

extern "C" __global__ void fused_add_rmsnorm(scalar_t* input, scalar_t* residual, const scalar_t* weight,
                                             int num_tokens, int hidden, float eps) {
    __shared__ float partial[THREADS];
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    scalar_t* in_row = input + row;
    scalar_t* res_row = residual + row;

    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float x = static_cast<float>(in_row[i]) + static_cast<float>(res_row[i]);
        res_row[i] = static_cast<scalar_t>(x);
        sum_sq += x * x;
    }
    partial[threadIdx.x] = sum_sq;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x] += partial[threadIdx.x + stride];
        }
        __syncthreads();
    }
    const float r = rsqrtf(partial[0] / static_cast<float>(hidden) + eps);

    // Each thread reads back only the residual elements it wrote itself, so no barrier is needed.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float x = static_cast<float>(res_row[i]);
        in_row[i] = static_cast<scalar_t>(x * r * static_cast<float>(weight[i]));
    }
}
