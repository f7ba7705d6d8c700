// Hand variant of the 750c670 sweep winner (merge/pairs): two pairs per row of threads.
// merge_attn_states_lse: merge two partial attention states by their base-2 log-sum-exp, per (token, head):
// m = max(sa, sb); wa = 2^(sa - m); wb = 2^(sb - m); out = (va * wa + vb * wb) / (wa + wb);
// lse = log2(wa + wb) + m; both states empty (-inf) gives out = 0, lse = -inf.
// Recipe merge/pairs: a block holds PAIRS (token, head) pairs, one row of threads each
// (threadIdx.y); a row of threads covers head_dim in 16-byte vectors, ITEMS per thread in
// flight, so a pair's weights are computed once per thread from two broadcast loads and no
// thread divides to find its pair. A scalar path covers head_dim not a multiple of 8 or
// unaligned pointers.
// launch: grid=(cdiv(num_tokens * num_heads, 2 * PAIRS),) block=(min(32, cdiv(head_dim, 8)), PAIRS) smem=0
// flags: --use_fast_math
// tune: PAIRS=4,8,16
// tune: ITEMS=1,2
#ifndef PAIRS
#define PAIRS 8
#endif
#ifndef ITEMS
#define ITEMS 1
#endif

constexpr int VEC = 16 / sizeof(scalar_t);

template <int V>
struct alignas(sizeof(scalar_t) * V) Pack {
    scalar_t v[V];
};

// m = max(sa, sb); the states' weights 2^(s - m) / (2^(sa - m) + 2^(sb - m)) and the merged
// lse = log2(sum) + m; both states empty (-inf) gives weights 0 and lse -inf.
__device__ __forceinline__ void merge_weights(float sa, float sb, float& fa, float& fb, float& lse) {
    const float neg_inf = __int_as_float(0xff800000u);
    const float m = fmaxf(sa, sb);
    fa = 0.0f;
    fb = 0.0f;
    lse = neg_inf;
    if (m != neg_inf) {  // both empty: m - m would be NaN
        const float wa = exp2f(sa - m);
        const float wb = exp2f(sb - m);
        const float inv = 1.0f / (wa + wb);
        fa = wa * inv;
        fb = wb * inv;
        lse = log2f(wa + wb) + m;
    }
}


template <int V>
__device__ __forceinline__ void merge_body(scalar_t* __restrict__ v_out, float* __restrict__ s_out,
                                           const scalar_t* __restrict__ v_a, const float* __restrict__ s_a,
                                           const scalar_t* __restrict__ v_b, const float* __restrict__ s_b,
                                           long long pairs, int head_dim) {
    // Two pairs per row of threads (this pair and the one PAIRS rows on): all four vectors and
    // four lse loads in flight before any math.
    using P = Pack<V>;
    const long long p0 = static_cast<long long>(blockIdx.x) * 2 * blockDim.y + threadIdx.y;
    const long long p1 = p0 + blockDim.y;
    if (p0 >= pairs) return;
    const bool two = p1 < pairs;
    const int per_pair = head_dim / V;
    const float sa0 = s_a[p0], sb0 = s_b[p0];
    const float sa1 = two ? s_a[p1] : 0.0f, sb1 = two ? s_b[p1] : 0.0f;
    for (int j = threadIdx.x; j < per_pair; j += blockDim.x) {
        const P a0 = reinterpret_cast<const P*>(v_a)[p0 * per_pair + j];
        const P b0 = reinterpret_cast<const P*>(v_b)[p0 * per_pair + j];
        P a1, b1;
        if (two) {
            a1 = reinterpret_cast<const P*>(v_a)[p1 * per_pair + j];
            b1 = reinterpret_cast<const P*>(v_b)[p1 * per_pair + j];
        }
        float fa, fb, lse;
        merge_weights(sa0, sb0, fa, fb, lse);
        P r;
#pragma unroll
        for (int e = 0; e < V; ++e) r.v[e] = static_cast<scalar_t>(static_cast<float>(a0.v[e]) * fa + static_cast<float>(b0.v[e]) * fb);
        reinterpret_cast<P*>(v_out)[p0 * per_pair + j] = r;
        if (j == 0) s_out[p0] = lse;
        if (two) {
            merge_weights(sa1, sb1, fa, fb, lse);
#pragma unroll
            for (int e = 0; e < V; ++e) r.v[e] = static_cast<scalar_t>(static_cast<float>(a1.v[e]) * fa + static_cast<float>(b1.v[e]) * fb);
            reinterpret_cast<P*>(v_out)[p1 * per_pair + j] = r;
            if (j == 0) s_out[p1] = lse;
        }
    }
}


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
    if (head_dim % VEC == 0 && (addr & 15) == 0) {
        merge_body<VEC>(v_out, s_out, v_a, s_a, v_b, s_b, pairs, head_dim);
    } else {
        merge_body_scalar(v_out, s_out, v_a, s_a, v_b, s_b, pairs, head_dim);
    }
}

extern "C" __global__ void __launch_bounds__(32 * PAIRS, 1) merge_attn_states_lse(
    scalar_t* __restrict__ v_out,
    float* __restrict__ s_out,
    const scalar_t* __restrict__ v_a,
    const float* __restrict__ s_a,
    const scalar_t* __restrict__ v_b,
    const float* __restrict__ s_b,
    int num_tokens,
    int num_heads,
    int head_dim) {
    merge_states(v_out, s_out, v_a, s_a, v_b, s_b, num_tokens, num_heads, head_dim);
}

