// per_token_fp8_quant baseline: scale = max|x| / 448 per row (1 for an all-zero row),
// out = e4m3(clamp(x / scale, -448, 448)), fp32 math.
// The straightforward first kernel: one block per token, scalar loads, a shared-memory tree
// reduction of max|x|, then a second pass over the row that quantises.
// launch: grid=(num_tokens,) block=(BLOCK,) smem=0
// flags: --use_fast_math
// tune: BLOCK=256,128,512,1024

#ifndef BLOCK
#define BLOCK 256
#endif
#define THREADS BLOCK

extern "C" __global__ __launch_bounds__(BLOCK) void per_token_fp8_quant(__nv_fp8_e4m3* __restrict__ out, float* __restrict__ scales, const scalar_t* __restrict__ input, int num_tokens, int hidden) {
    __shared__ float partial[THREADS];
    const long long row = blockIdx.x;
    const scalar_t* x = input + row * hidden;
    __nv_fp8_e4m3* q = out + row * hidden;

    float amax = 0.0f;
    #pragma unroll 4
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        amax = fmaxf(amax, fabsf(static_cast<float>(x[i])));
    }
    partial[threadIdx.x] = amax;
    __syncthreads();
    #pragma unroll 4
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
        }
        __syncthreads();
    }
    const float scale = partial[0] > 0.0f ? partial[0] / 448.0f : 1.0f;
    if (threadIdx.x == 0) scales[row] = scale;

    #pragma unroll 4
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = fminf(fmaxf(static_cast<float>(x[i]) / scale, -448.0f), 448.0f);
        q[i] = __nv_fp8_e4m3(v);  // round to nearest even, saturating
    }
}
