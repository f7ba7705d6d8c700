// Shared by the recipes with a HINT tuning (merge/flat, merge/pairs, row_norm/prefetch, row_norm/warp):
// streaming loads and stores of 16-byte vectors.
// Loads and stores of data touched once: with HINT a 16-byte vector goes through the streaming
// (evict-first) cache path, so it does not push out of L2 what is still to be read (a weight
// every row shares); narrower accesses stay plain.
template <typename P>
__device__ __forceinline__ P load_vec(const P* p) {
    if constexpr (HINT && sizeof(P) == 16) {
        const uint4 r = __ldcs(reinterpret_cast<const uint4*>(p));
        return *reinterpret_cast<const P*>(&r);
    } else {
        return *p;
    }
}

template <typename P>
__device__ __forceinline__ void store_vec(P* p, const P& v) {
    if constexpr (HINT && sizeof(P) == 16) {
        __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&v));
    } else {
        *p = v;
    }
}
