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

// One pass over a pair's vectors: the ITEMS vectors of each state from ``first`` on (a row of
// threads apart), loaded before any is used.
template <int V>
__device__ __forceinline__ void load_pass(const Pack<V>* __restrict__ a, const Pack<V>* __restrict__ b, int per_pair,
                                          int first, Pack<V> (&ra)[ITEMS], Pack<V> (&rb)[ITEMS]) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int j = first + k * blockDim.x;
        if (j < per_pair) {
            ra[k] = load_vec(a + j);
            rb[k] = load_vec(b + j);
        }
    }
}

template <int V>
__device__ __forceinline__ void store_pass(Pack<V>* __restrict__ o, int per_pair, int first,
                                           const Pack<V> (&ra)[ITEMS], const Pack<V> (&rb)[ITEMS], float fa, float fb) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int j = first + k * blockDim.x;
        if (j >= per_pair) continue;
        Pack<V> r;
#pragma unroll
        for (int e = 0; e < V; ++e) {
            r.v[e] = static_cast<scalar_t>(static_cast<float>(ra[k].v[e]) * fa + static_cast<float>(rb[k].v[e]) * fb);
        }
        store_vec(o + j, r);
    }
}

// The pair's vectors past the first pass (head_dim over 256 * ITEMS, or the scalar path), out of line.
template <int V>
__device__ __noinline__ void merge_rest(Pack<V>* __restrict__ o, const Pack<V>* __restrict__ a,
                                        const Pack<V>* __restrict__ b, int per_pair, int first, int step,
                                        float fa, float fb) {
    for (; first < per_pair; first += step) {
        Pack<V> ra[ITEMS], rb[ITEMS];
        load_pass<V>(a, b, per_pair, first, ra, rb);
        store_pass<V>(o, per_pair, first, ra, rb, fa, fb);
    }
}

template <int V>
__device__ __forceinline__ void merge_body(scalar_t* __restrict__ v_out, float* __restrict__ s_out,
                                           const scalar_t* __restrict__ v_a, const float* __restrict__ s_a,
                                           const scalar_t* __restrict__ v_b, const float* __restrict__ s_b,
                                           long long pairs, int head_dim) {
    using P = Pack<V>;
    const long long pair = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;
    if (pair >= pairs) return;
    const float sa = s_a[pair], sb = s_b[pair];
    const int per_pair = head_dim / V;
    const P* a = reinterpret_cast<const P*>(v_a) + pair * per_pair;
    const P* b = reinterpret_cast<const P*>(v_b) + pair * per_pair;
    P* o = reinterpret_cast<P*>(v_out) + pair * per_pair;
    // The first pass with no loop around it (a row of threads is sized so that it covers the
    // pair in one pass up to head_dim 256 * ITEMS): a loop put a test and a branch between the
    // entry and the first vector load of every block, and a block lives about one trip to memory.
    P ra[ITEMS], rb[ITEMS];
    load_pass<V>(a, b, per_pair, threadIdx.x, ra, rb);
    // The weights after the vectors' loads are issued, not before: computed first, they held
    // every vector load back until the two lse loads had come back, two trips to memory one
    // after the other instead of one (nvdisasm, sm_90).
    float fa, fb, lse;
    merge_weights(sa, sb, fa, fb, lse);
    store_pass<V>(o, per_pair, threadIdx.x, ra, rb, fa, fb);
    const int step = blockDim.x * ITEMS;
    if (static_cast<int>(threadIdx.x) + step < per_pair) merge_rest<V>(o, a, b, per_pair, threadIdx.x + step, step, fa, fb);
    if (threadIdx.x == 0) s_out[pair] = lse;
}

${mergedispatch}
${entry}
