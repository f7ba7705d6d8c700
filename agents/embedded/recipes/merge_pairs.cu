// ${kernel}: merge two partial attention states by their base-2 log-sum-exp, per (token, head):
// m = max(sa, sb); wa = 2^(sa - m); wb = 2^(sb - m); out = (va * wa + vb * wb) / (wa + wb);
// lse = log2(wa + wb) + m; both states empty (-inf) gives out = 0, lse = -inf.
// Recipe merge/pairs: a block holds PAIRS (token, head) pairs, one row of threads each
// (threadIdx.y); a row of threads covers head_dim in 16-byte vectors, ITEMS per thread in
// flight, so a pair's weights are computed once per thread from two broadcast loads and no
// thread divides to find its pair; HINT picks the vectors' cache path (stream_common.cu).
// A scalar path covers head_dim not a multiple of 8 or unaligned pointers.
${header}
${guards}
${mergecommon}
${streamcommon}

template <int V>
__device__ __forceinline__ void merge_body(scalar_t* __restrict__ v_out, float* __restrict__ s_out,
                                           const scalar_t* __restrict__ v_a, const float* __restrict__ s_a,
                                           const scalar_t* __restrict__ v_b, const float* __restrict__ s_b,
                                           long long pairs, int head_dim) {
    using P = Pack<V>;
    const long long pair = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;
    if (pair >= pairs) return;
    // The weights are computed after the first vectors' loads are issued, not before: computed
    // first, they held every vector load back until the two lse loads had come back, two trips
    // to memory one after the other instead of one (nvdisasm, sm_90).
    const float sa = s_a[pair], sb = s_b[pair];
    float fa = 0.0f, fb = 0.0f, lse = 0.0f;
    bool weighed = false;
    const int per_pair = head_dim / V;
    const P* a = reinterpret_cast<const P*>(v_a) + pair * per_pair;
    const P* b = reinterpret_cast<const P*>(v_b) + pair * per_pair;
    P* o = reinterpret_cast<P*>(v_out) + pair * per_pair;
    for (int first = threadIdx.x; first < per_pair; first += blockDim.x * ITEMS) {
        P ra[ITEMS], rb[ITEMS];
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {  // every load first, then the math
            const int j = first + k * blockDim.x;
            if (j < per_pair) {
                ra[k] = load_vec(a + j);
                rb[k] = load_vec(b + j);
            }
        }
        if (!weighed) {
            merge_weights(sa, sb, fa, fb, lse);
            weighed = true;
        }
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int j = first + k * blockDim.x;
            if (j >= per_pair) continue;
            P r;
#pragma unroll
            for (int e = 0; e < V; ++e) {
                r.v[e] = static_cast<scalar_t>(static_cast<float>(ra[k].v[e]) * fa + static_cast<float>(rb[k].v[e]) * fb);
            }
            store_vec(o + j, r);
        }
    }
    if (threadIdx.x == 0) s_out[pair] = lse;  // thread 0 always has vectors (head_dim >= V): it has weighed
}

${mergedispatch}
${entry}
