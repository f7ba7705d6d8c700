// ${kernel}: merge two partial attention states by their base-2 log-sum-exp, per (token, head):
// m = max(sa, sb); wa = 2^(sa - m); wb = 2^(sb - m); out = (va * wa + vb * wb) / (wa + wb);
// lse = log2(wa + wb) + m; both states empty (-inf) gives out = 0, lse = -inf.
// Recipe merge/flat: head_dim is split into 16-byte vectors (8 halves) and the whole
// [tokens, heads, head_dim / 8] range is one flat index space, so a thread group per
// (token, head) covers head_dim and a block spans several heads; each thread keeps ITEMS
// vectors in flight (HINT: their cache path, stream_common.cu). A scalar path covers head_dim
// not a multiple of 8 or unaligned pointers.
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
    const int per_pair = head_dim / V;
    const long long total = pairs * per_pair;
    // blockDim.x is BLOCK, or fewer on a launch too small to give every SM a block.
    const int nt = blockDim.x;
    const long long step = static_cast<long long>(gridDim.x) * nt * ITEMS;
    for (long long first = static_cast<long long>(blockIdx.x) * nt * ITEMS + threadIdx.x; first < total; first += step) {
        P a[ITEMS], b[ITEMS];
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const long long i = first + static_cast<long long>(k) * nt;
            if (i < total) {
                a[k] = load_vec(reinterpret_cast<const P*>(v_a) + i);
                b[k] = load_vec(reinterpret_cast<const P*>(v_b) + i);
            }
        }
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const long long i = first + static_cast<long long>(k) * nt;
            if (i >= total) continue;
            const long long pair = i / per_pair;
            const float sa = s_a[pair];
            const float sb = s_b[pair];
            float fa, fb, lse;
            merge_weights(sa, sb, fa, fb, lse);
            P o;
#pragma unroll
            for (int j = 0; j < V; ++j) {
                o.v[j] = static_cast<scalar_t>(static_cast<float>(a[k].v[j]) * fa + static_cast<float>(b[k].v[j]) * fb);
            }
            store_vec(reinterpret_cast<P*>(v_out) + i, o);
            if (i == pair * per_pair) s_out[pair] = lse;
        }
    }
}

${mergedispatch}
${entry}
