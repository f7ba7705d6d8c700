// Resource error (grid): one block per element times a padding factor; at 4096 x 14336 the grid
// has 2^34 blocks, beyond the 2^31 - 1 the x dimension allows (a launch would fail or wrap).
// launch: grid=(num_tokens * d * 256,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<long long>(num_tokens) * d) return;
    const long long token = i / d, col = i % d;
    const float g = static_cast<float>(x[token * 2 * d + col]);
    out[i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + col]));
}
