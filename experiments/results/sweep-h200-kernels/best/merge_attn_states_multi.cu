// merge_attn_states_multi baseline: per (token, head), m = max lse, w_p = 2^(lse_p - m),
// v_out = sum w_p v_p / sum w_p, lse_out = log2(sum w_p) + m; all -inf -> 0 and -inf.
// The straightforward first kernel: one block per (token, head), threads striding over
// head_dim, every thread recomputing the weights inside its loop, scalar loads.
// launch: grid=(num_tokens*num_heads,) block=(128,) smem=0
// flags: --use_fast_math

#define NEG_INF __int_as_float(0xff800000)  // -inf; NVRTC has no <cmath> INFINITY

extern "C" __global__ __launch_bounds__(128) void merge_attn_states_multi(scalar_t* __restrict__ v_out, float* __restrict__ lse_out, const scalar_t* __restrict__ v, const float* __restrict__ lse, int num_states, int num_tokens, int num_heads, int head_dim) {
    const long long th = blockIdx.x;  // token * num_heads + head
    const long long state_stride = (long long)num_tokens * num_heads;
    scalar_t* dst = v_out + th * head_dim;

    float m = NEG_INF;
    #pragma unroll 4
    for (int p = 0; p < num_states; ++p) m = fmaxf(m, lse[p * state_stride + th]);
    if (m == NEG_INF) {
        #pragma unroll 4
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = static_cast<scalar_t>(0.0f);
        if (threadIdx.x == 0) lse_out[th] = NEG_INF;
        return;
    }
    float s = 0.0f;
    #pragma unroll 4
    for (int p = 0; p < num_states; ++p) s += exp2f(lse[p * state_stride + th] - m);

    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        #pragma unroll 4
        for (int p = 0; p < num_states; ++p) {
            const float w = exp2f(lse[p * state_stride + th] - m);
            acc += static_cast<float>(v[(p * state_stride + th) * head_dim + d]) * w;
        }
        dst[d] = static_cast<scalar_t>(acc / s);
    }
    if (threadIdx.x == 0) lse_out[th] = log2f(s) + m;
}
