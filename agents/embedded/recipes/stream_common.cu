// Shared by the recipes with a HINT tuning (gated_act, merge, row_norm/prefetch and /warp):
// streaming loads and stores of 16-byte vectors.
// Loads and stores of data touched once. HINT 1: a 16-byte vector is loaded and stored through
// the streaming (evict-first) cache path, so it does not push out of L2 what is still to be read
// (a weight every row shares). HINT 2: loads streamed, stores plain, so written lines may stay in
// L2 past the kernel's end instead of going to memory inside it. Narrower accesses stay plain.
template <typename P>
__device__ __forceinline__ P load_vec(const P* p) {
    if constexpr ((HINT == 1 || HINT == 2) && sizeof(P) == 16) {
        const uint4 r = __ldcs(reinterpret_cast<const uint4*>(p));
        return *reinterpret_cast<const P*>(&r);
    } else {
        return *p;
    }
}

template <typename P>
__device__ __forceinline__ void store_vec(P* p, const P& v) {
    if constexpr (HINT == 1 && sizeof(P) == 16) {
        __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&v));
    } else {
        *p = v;
    }
}
