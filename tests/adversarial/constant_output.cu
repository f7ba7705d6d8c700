// Cheat (degenerate output): writes v_out = 0 and s_out = max(s_a, s_b) without reading the
// values. Passes allclose on all-zero or near-zero test values and loose atol; wrong on
// real ones.
// launch: grid=(cdiv(num_tokens * num_heads * head_dim, 256),) block=(256,) smem=0

extern "C" __global__ void merge_attn_states_lse(scalar_t* v_out, float* s_out, const scalar_t* v_a,
                                                 const float* s_a, const scalar_t* v_b, const float* s_b,
                                                 int num_tokens, int num_heads, int head_dim) {
    const long long pairs = static_cast<long long>(num_tokens) * num_heads;
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < pairs * head_dim) {
        v_out[i] = static_cast<scalar_t>(0.0f);
    }
    if (i < pairs) {
        s_out[i] = fmaxf(s_a[i], s_b[i]);
    }
}
