// cross_entropy_rows baseline: loss = logsumexp(x) - x[target] per row (0 for target -100),
// fp32 math. The straightforward first kernel: one block per row, scalar loads, two passes
// (max, sum of exp), each reduction a shared-memory tree.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256
#define NEG_INF __int_as_float(0xff800000)

__device__ float block_reduce(float v, float* red, bool is_max) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            const float other = red[threadIdx.x + stride];
            red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], other) : red[threadIdx.x] + other;
        }
        __syncthreads();
    }
    const float result = red[0];
    __syncthreads();
    return result;
}

extern "C" __global__ void cross_entropy_rows(float* loss, const scalar_t* logits, const long long* target,
                                              int num_tokens, int vocab) {
    __shared__ float red[THREADS];
    const long long row = blockIdx.x;
    const scalar_t* src = logits + row * vocab;
    const long long t = target[row];

    float m = NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, static_cast<float>(src[i]));
    m = block_reduce(m, red, true);
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += expf(static_cast<float>(src[i]) - m);
    s = block_reduce(s, red, false);
    if (threadIdx.x == 0) {
        loss[row] = t == -100 ? 0.0f : m + logf(s) - static_cast<float>(src[t]);
    }
}
