// Shared by the row recipes (row_norm, layer_norm, row_quant): 16-byte vectors of a row and
// warp-wide reductions.
constexpr int VEC = 16 / sizeof(scalar_t);

template <int V>
struct alignas(sizeof(scalar_t) * V) Pack {
    scalar_t v[V];
};

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

__device__ __forceinline__ float warp_max(float s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}
