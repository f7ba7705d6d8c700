// gemma_fused_add_rmsnorm baseline: x = input + residual; residual <- x;
// input <- x * rsqrt(mean(x^2) + eps) * (1 + w), fp32 math.
// The straightforward first kernel: one block per token, scalar loads, a shared-memory tree
// reduction of the sum of squares, and a second pass that re-reads the stored residual.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256

extern "C" __global__ void gemma_fused_add_rmsnorm(scalar_t* input, scalar_t* residual,
                                                   const scalar_t* weight, int num_tokens,
                                                   int hidden, float eps) {
    __shared__ float partial[THREADS];
    const long long row = blockIdx.x;
    scalar_t* x_row = input + row * hidden;
    scalar_t* r_row = residual + row * hidden;

    float sum = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(x_row[i]) + static_cast<float>(r_row[i]);
        r_row[i] = static_cast<scalar_t>(v);
        sum += v * v;
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    const float r = rsqrtf(partial[0] / hidden + eps);

    // Each thread re-reads only the residual elements it wrote itself, so no barrier is needed.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(r_row[i]);
        x_row[i] = static_cast<scalar_t>(v * r * (1.0f + static_cast<float>(weight[i])));
    }
}
