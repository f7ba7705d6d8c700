// Shared by the two-state merge recipes: the entry's call, to the template's merge_body with
// 16-byte vectors where head_dim and every pointer allow them, else element by element.

// The element-by-element path (rare) out of line: inline, the compiler laid it before the
// vector path, so every launch jumped over its code (nvdisasm, sm_90).
__device__ __noinline__ void merge_body_scalar(scalar_t* __restrict__ v_out, float* __restrict__ s_out,
                                               const scalar_t* __restrict__ v_a, const float* __restrict__ s_a,
                                               const scalar_t* __restrict__ v_b, const float* __restrict__ s_b,
                                               long long pairs, int head_dim) {
    merge_body<1>(v_out, s_out, v_a, s_a, v_b, s_b, pairs, head_dim);
}

__device__ __forceinline__ void merge_states(scalar_t* v_out, float* s_out, const scalar_t* v_a, const float* s_a,
                                             const scalar_t* v_b, const float* s_b, int tokens, int heads,
                                             int head_dim) {
    const long long pairs = static_cast<long long>(tokens) * heads;
    const unsigned long long addr = reinterpret_cast<unsigned long long>(v_out) | reinterpret_cast<unsigned long long>(v_a) |
                                    reinterpret_cast<unsigned long long>(v_b);
    // Expected false, so that the vector path is the one laid straight after the entry.
    if (__builtin_expect(head_dim % VEC != 0 || (addr & 15) != 0, 0)) {
        merge_body_scalar(v_out, s_out, v_a, s_a, v_b, s_b, pairs, head_dim);
        return;
    }
    merge_body<VEC>(v_out, s_out, v_a, s_a, v_b, s_b, pairs, head_dim);
}
