// layernorm baseline: out = (x - mean) * rsqrt(var + eps) * w + b per row, fp32 math,
// variance taken around the mean (two passes).
// The straightforward first kernel: one block per token, scalar loads, two shared-memory
// tree reductions (sum, then sum of squared deviations), then a third pass that writes.
// launch: grid=(num_tokens,) block=(BLOCK,) smem=0
// tune: BLOCK=256,128,512,1024

#ifndef BLOCK
#define BLOCK 256
#endif
#define THREADS BLOCK

__device__ float block_sum(float v, float* partial) {
    partial[threadIdx.x] = v;
    __syncthreads();
    #pragma unroll 4
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    const float total = partial[0];
    __syncthreads();  // partial is reused by the next reduction
    return total;
}

extern "C" __global__ void layernorm(scalar_t* out, const scalar_t* input, const scalar_t* weight,
                                     const scalar_t* bias, int num_tokens, int hidden, float eps) {
    __shared__ float partial[THREADS];
    const long long row = blockIdx.x;
    const scalar_t* x = input + row * hidden;
    scalar_t* y = out + row * hidden;

    float sum = 0.0f;
    #pragma unroll 4
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) sum += static_cast<float>(__ldg(&x[i]));
    const float mean = block_sum(sum, partial) / hidden;

    float sq = 0.0f;
    #pragma unroll 4
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float dev = static_cast<float>(__ldg(&x[i])) - mean;
        sq += dev * dev;
    }
    const float r = rsqrtf(block_sum(sq, partial) / hidden + eps);

    #pragma unroll 4
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = (static_cast<float>(__ldg(&x[i])) - mean) * r;
        y[i] = static_cast<scalar_t>(v * static_cast<float>(__ldg(&weight[i])) + static_cast<float>(__ldg(&bias[i])));
    }
}
