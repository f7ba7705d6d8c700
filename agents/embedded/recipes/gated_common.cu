// Shared by the gated_act recipes (after stream_common.cu, whose load_vec and store_vec move their
// 16-byte vectors): the activation and the elementwise act(gate) * up on one vector.
constexpr int VEC = 16 / sizeof(scalar_t);

__device__ __forceinline__ float act(float g) { return ${act}; }

// Sixteen bytes seen as raw words (for the load/store instructions) or as elements.
union Vec16 {
    uint4 raw;
    scalar_t e[VEC];
};

__device__ __forceinline__ uint4 gate_times_up(uint4 g, uint4 u) {
    Vec16 gv, uv, ov;
    gv.raw = g;
    uv.raw = u;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        ov.e[k] = static_cast<scalar_t>(act(static_cast<float>(gv.e[k])) * static_cast<float>(uv.e[k]));
    }
    return ov.raw;
}
