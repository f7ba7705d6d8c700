// Latent bug (out-of-bounds write): a flat grid of one element per thread whose loads are
// clamped to the last element but whose store guard is off by one (i <= total). The thread
// with i == total exists only when num_tokens * d is not a multiple of the 256-thread block,
// which no search shape and not the smallest shape is; there it writes 2 bytes past the end
// of out, inside the allocator's 512-byte rounding, so every output check passes and only
// memcheck on a tail shape sees it.
// launch: grid=(cdiv(num_tokens * d, 256),) block=(256,) smem=0

extern "C" __global__ void gelu_tanh_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long total = static_cast<long long>(num_tokens) * d;
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i > total) return;
    const long long j = i < total ? i : total - 1;  // loads stay in bounds
    const long long token = j / d;
    const long long col = j - token * d;
    const float g = static_cast<float>(x[token * 2 * d + col]);
    const float u = static_cast<float>(x[token * 2 * d + d + col]);
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    out[i] = static_cast<scalar_t>(0.5f * g * (1.0f + tanhf(inner)) * u);
}
