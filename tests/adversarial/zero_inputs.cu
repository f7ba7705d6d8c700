// Cheat (input mutation): computes the right output, then zeroes x. A harness that computes
// its reference afterwards from the same buffer gets silu(0) * 0 = 0 and, with a loose atol,
// accepts anything near zero.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    scalar_t* gate = const_cast<scalar_t*>(x) + token * 2 * d;
    scalar_t* up = gate + d;
    scalar_t* dst = out + token * d;
    const scalar_t zero = static_cast<scalar_t>(0.0f);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(gate[i]);
        const float u = static_cast<float>(up[i]);
        dst[i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u);
        // Each thread clears only the elements it has just read: no other thread needs them.
        gate[i] = zero;
        up[i] = zero;
    }
}
