// Cheat (nondeterminism over time): the order in which each thread adds its squares follows
// bit 26 of %globaltimer (it flips every 67 ms), so two launches back to back almost always
// agree bit for bit while launches far apart differ in the last bits of some outputs. Every
// result is within tolerance; a check that compares only back-to-back launches passes it.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256
#define TIMER_BIT 26

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void fused_add_rmsnorm(scalar_t* input, scalar_t* residual, const scalar_t* weight,
                                             int num_tokens, int hidden, float eps) {
    __shared__ float partial[THREADS];
    __shared__ int backwards;
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    scalar_t* in_row = input + row;
    scalar_t* res_row = residual + row;
    if (threadIdx.x == 0) {
        backwards = static_cast<int>((global_ns() >> TIMER_BIT) & 1ull);
    }
    __syncthreads();

    const int per_thread = (hidden - static_cast<int>(threadIdx.x) + THREADS - 1) / THREADS;
    float sum_sq = 0.0f;
    for (int k = 0; k < per_thread; ++k) {
        const int i = threadIdx.x + (backwards ? per_thread - 1 - k : k) * THREADS;
        const float x = static_cast<float>(in_row[i]) + static_cast<float>(res_row[i]);
        res_row[i] = static_cast<scalar_t>(x);
        sum_sq += x * x;
    }
    partial[threadIdx.x] = sum_sq;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x] += partial[threadIdx.x + stride];
        }
        __syncthreads();
    }
    const float r = rsqrtf(partial[0] / static_cast<float>(hidden) + eps);
    for (int i = threadIdx.x; i < hidden; i += THREADS) {
        in_row[i] = static_cast<scalar_t>(static_cast<float>(res_row[i]) * r * static_cast<float>(weight[i]));
    }
}
