// merge_attn_states_lse, vectorised: a flat grid with one 16-byte vector (8 elements) of one
// (token, head) pair per thread, so decode-sized token counts still spread over every SM.
// Each thread recomputes its pair's weights from two fp32 lse loads that the pair's other
// threads share through L1 (exp2 intrinsics, one reciprocal instead of two divisions); the
// pair's first vector writes the merged lse. head_dim not a multiple of 8 takes a scalar path.
// launch: grid=(cdiv(num_tokens * num_heads * head_dim, BLOCK * 8),) block=(BLOCK,) smem=0
// tune: BLOCK=256,128,512,64

#ifndef BLOCK
#define BLOCK 256
#endif
#define ELEMS 8  // elements per thread: one 16-byte vector of a 2-byte type
static_assert(sizeof(scalar_t) * ELEMS == 16, "vector path assumes a 2-byte element type");

// Weights of the two states and the merged lse; both -inf is the empty state (weights 0).
__device__ __forceinline__ void merge_weights(float sa, float sb, float& wa, float& wb, float& lse) {
    const float neg_inf = __int_as_float(0xff800000u);
    const float m = fmaxf(sa, sb);
    if (m == neg_inf) {
        wa = 0.0f;
        wb = 0.0f;
        lse = neg_inf;
        return;
    }
    const float ea = exp2f(sa - m);  // a -inf side gives exactly 0
    const float eb = exp2f(sb - m);
    const float total = ea + eb;  // in [1, 2]: the approximate log2 is accurate to ~2^-22
    const float inv = __frcp_rn(total);
    wa = ea * inv;
    wb = eb * inv;
    lse = __log2f(total) + m;
}

__device__ __forceinline__ void scalar_elems(scalar_t* v_out, float* s_out, const scalar_t* v_a, const float* s_a,
                                             const scalar_t* v_b, const float* s_b, long long e0,
                                             long long total, int head_dim) {
    for (long long e = e0; e < e0 + ELEMS && e < total; ++e) {
        const long long pair = e / head_dim;
        float wa, wb, lse;
        merge_weights(s_a[pair], s_b[pair], wa, wb, lse);
        v_out[e] = static_cast<scalar_t>(static_cast<float>(v_a[e]) * wa + static_cast<float>(v_b[e]) * wb);
        if (e - pair * head_dim == 0) s_out[pair] = lse;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
    merge_attn_states_lse(scalar_t* __restrict__ v_out, float* __restrict__ s_out,
                          const scalar_t* __restrict__ v_a, const float* __restrict__ s_a,
                          const scalar_t* __restrict__ v_b, const float* __restrict__ s_b, int num_tokens,
                          int num_heads, int head_dim) {
    const long long total = static_cast<long long>(num_tokens) * num_heads * head_dim;
    const long long g = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
    const long long e0 = g * ELEMS;
    if (e0 >= total) return;
    const unsigned long long addr_bits = reinterpret_cast<unsigned long long>(v_out) |
                                         reinterpret_cast<unsigned long long>(v_a) |
                                         reinterpret_cast<unsigned long long>(v_b);
    if (head_dim % ELEMS != 0 || (addr_bits & 15) != 0) {
        scalar_elems(v_out, s_out, v_a, s_a, v_b, s_b, e0, total, head_dim);
        return;
    }
    // 32-bit division: fewer than 2^32 vectors (64 GiB per tensor) in any real launch.
    const unsigned int vecs_per_head = static_cast<unsigned int>(head_dim / ELEMS);
    const unsigned int pair = static_cast<unsigned int>(g) / vecs_per_head;
    float wa, wb, lse;
    merge_weights(s_a[pair], s_b[pair], wa, wb, lse);

    const uint4 a = reinterpret_cast<const uint4*>(v_a)[g];
    const uint4 b = reinterpret_cast<const uint4*>(v_b)[g];
    const scalar_t* ea = reinterpret_cast<const scalar_t*>(&a);
    const scalar_t* eb = reinterpret_cast<const scalar_t*>(&b);
    uint4 out;
    scalar_t* eo = reinterpret_cast<scalar_t*>(&out);
#pragma unroll
    for (int j = 0; j < ELEMS; ++j) {
        eo[j] = static_cast<scalar_t>(static_cast<float>(ea[j]) * wa + static_cast<float>(eb[j]) * wb);
    }
    reinterpret_cast<uint4*>(v_out)[g] = out;
    if (static_cast<unsigned int>(g) == pair * vecs_per_head) s_out[pair] = lse;
}
