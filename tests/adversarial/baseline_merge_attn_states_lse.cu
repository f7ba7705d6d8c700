// Copy of kernels/merge_attn_states_lse/baseline.cu: a variant identical in code to the baseline must pass (speedup ~1).
// merge_attn_states_lse baseline: merge two partial attention states by their base-2 lse.
// The straightforward first kernel: one block per token, threads striding over the token's
// num_heads * head_dim elements with scalar loads; each element recomputes its head's
// weights with exp2f, and the first element of each head writes the merged lse with log2f.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void merge_attn_states_lse(scalar_t* v_out, float* s_out, const scalar_t* v_a,
                                                 const float* s_a, const scalar_t* v_b, const float* s_b,
                                                 int num_tokens, int num_heads, int head_dim) {
    const long long token = blockIdx.x;
    const int row = num_heads * head_dim;
    const long long base = token * row;
    const float neg_inf = __int_as_float(0xff800000u);
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const int head = i / head_dim;
        const long long pair = token * num_heads + head;
        const float sa = s_a[pair];
        const float sb = s_b[pair];
        const float m = fmaxf(sa, sb);
        float out = 0.0f;
        float lse = neg_inf;
        // Both states empty: m - m would be NaN; the merged state is defined as empty too.
        if (m != neg_inf) {
            const float wa = exp2f(sa - m);
            const float wb = exp2f(sb - m);
            const float total = wa + wb;
            out = static_cast<float>(v_a[base + i]) * (wa / total) + static_cast<float>(v_b[base + i]) * (wb / total);
            lse = log2f(total) + m;
        }
        v_out[base + i] = static_cast<scalar_t>(out);
        if (i % head_dim == 0) {
            s_out[pair] = lse;
        }
    }
}
