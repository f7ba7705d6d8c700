// Shared by the two-state merge recipes (merge/flat, merge/pairs): 16-byte vectors and the
// weights of a (token, head) pair's two states.
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
