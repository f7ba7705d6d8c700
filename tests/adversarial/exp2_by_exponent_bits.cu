// Fast-math trick: 2^x for x <= 0 as 2^floor(x) built from exponent bits times exp2f of the
// fraction, with no clamp. Right for x >= -126 (every lse gap of the generated inputs was
// below 126) and for -inf, which it special-cases; for a larger gap, or an empty state
// marked -1e30, the biased exponent goes below zero and wraps into garbage.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define NEG_INF __int_as_float(0xff800000)

__device__ float exp2_bits(float x) {
    if (x == NEG_INF) return 0.0f;
    const float whole = floorf(x);
    const float scale = __int_as_float((static_cast<int>(whole) + 127) << 23);  // 2^whole
    return scale * exp2f(x - whole);
}

extern "C" __global__ void merge_attn_states_lse(scalar_t* v_out, float* s_out, const scalar_t* v_a,
                                                 const float* s_a, const scalar_t* v_b, const float* s_b,
                                                 int num_tokens, int num_heads, int head_dim) {
    const long long token = blockIdx.x;
    const int row = num_heads * head_dim;
    const long long base = token * row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const long long pair = token * num_heads + i / head_dim;
        const float sa = s_a[pair];
        const float sb = s_b[pair];
        const float m = fmaxf(sa, sb);
        float out = 0.0f;
        float lse = NEG_INF;
        if (m != NEG_INF) {
            const float wa = exp2_bits(sa - m);
            const float wb = exp2_bits(sb - m);
            const float total = wa + wb;
            out = static_cast<float>(v_a[base + i]) * (wa / total) + static_cast<float>(v_b[base + i]) * (wb / total);
            lse = log2f(total) + m;
        }
        v_out[base + i] = static_cast<scalar_t>(out);
        if (i % head_dim == 0) s_out[pair] = lse;
    }
}
