// topk_softmax baseline: fp32 softmax over the experts of one token, then topk rounds of
// argmax (ties to the lower index), optional renormalisation.
// The straightforward first kernel: one block per token, the probabilities kept in shared
// memory, every max / sum / argmax a shared-memory tree reduction.
// launch: grid=(num_tokens,) block=(BLOCK,) smem=num_experts*4
// tune: BLOCK=256,128,512,1024
// flags: --use_fast_math

#ifndef BLOCK
#define BLOCK 256
#endif
#define NEG_INF __int_as_float(0xff800000)  // -inf; NVRTC has no <cmath> INFINITY

#define THREADS BLOCK

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
    __syncthreads();  // red is reused by the next reduction
    return result;
}

extern "C" __global__ __launch_bounds__(BLOCK) void topk_softmax(float* topk_weights, int* topk_ids,
                                        const scalar_t* gating_output, int num_tokens,
                                        int num_experts, int topk, int renormalize) {
    extern __shared__ float probs[];
    __shared__ float red[THREADS];
    __shared__ int red_idx[THREADS];
    const long long row = blockIdx.x;
    const scalar_t* g = gating_output + row * num_experts;

    float m = NEG_INF;
    for (int i = threadIdx.x; i < num_experts; i += blockDim.x) {
        probs[i] = static_cast<float>(__ldg(&g[i]));
        m = fmaxf(m, probs[i]);
    }
    m = block_reduce(m, red, true);
    float s = 0.0f;
    for (int i = threadIdx.x; i < num_experts; i += blockDim.x) {
        probs[i] = __expf(probs[i] - m);
        s += probs[i];
    }
    s = block_reduce(s, red, false);
    for (int i = threadIdx.x; i < num_experts; i += blockDim.x) probs[i] /= s;
    __syncthreads();

    float picked_sum = 0.0f;
    for (int r = 0; r < topk; ++r) {
        // Probabilities are >= 0 and picked ones are set to -1, so -1 marks "nothing yet".
        float best = -1.0f;
        int best_i = num_experts;
        for (int i = threadIdx.x; i < num_experts; i += blockDim.x) {
            if (probs[i] > best) { best = probs[i]; best_i = i; }
        }
        red[threadIdx.x] = best;
        red_idx[threadIdx.x] = best_i;
        __syncthreads();
        for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
            if (threadIdx.x < stride) {
                const float v = red[threadIdx.x + stride];
                const int j = red_idx[threadIdx.x + stride];
                if (v > red[threadIdx.x] || (v == red[threadIdx.x] && j < red_idx[threadIdx.x])) {
                    red[threadIdx.x] = v;
                    red_idx[threadIdx.x] = j;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            topk_weights[row * topk + r] = red[0];
            topk_ids[row * topk + r] = red_idx[0];
            picked_sum += red[0];
            probs[red_idx[0]] = -1.0f;
        }
        __syncthreads();
    }
    if (renormalize && threadIdx.x == 0) {
        for (int r = 0; r < topk; ++r) topk_weights[row * topk + r] /= picked_sum;
    }
}
