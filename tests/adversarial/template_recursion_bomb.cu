// Attack (compiler time and memory): a template recursion that instantiates 2^40 classes;
// NVRTC would run for hours and eat all memory unless the compile is bounded.
// launch: grid=(num_tokens,) block=(256,) smem=0

template <int D, long long I> struct Bomb {
    static constexpr long long v = Bomb<D - 1, 2 * I>::v + Bomb<D - 1, 2 * I + 1>::v;
};
template <long long I> struct Bomb<0, I> { static constexpr long long v = I; };
__device__ long long bomb_sink = Bomb<40, 0>::v;

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + i]));
    }
}
