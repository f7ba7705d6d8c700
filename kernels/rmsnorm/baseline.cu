// rmsnorm baseline: out[t, i] = x[t, i] * rsqrt(mean(x[t, :]^2) + eps) * w[i], fp32 math.
// The straightforward first kernel: one block per token, scalar loads, the sum of squares
// reduced by a shared-memory tree, then a second pass over the row that writes the output.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256

extern "C" __global__ void rmsnorm(scalar_t* out, const scalar_t* input, const scalar_t* weight,
                                   int num_tokens, int hidden, float eps) {
    __shared__ float partial[THREADS];
    const long long row = blockIdx.x;
    const scalar_t* x = input + row * hidden;
    scalar_t* y = out + row * hidden;

    float sum = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(x[i]);
        sum += v * v;
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    const float r = rsqrtf(partial[0] / hidden + eps);

    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(x[i]);
        y[i] = static_cast<scalar_t>(v * r * static_cast<float>(weight[i]));
    }
}
