// silu_and_mul that forms gate * up in the element type before dividing by 1 + exp(-gate):
// right for ordinary inputs, but in fp16 the product overflows (|gate|, |up| in the hundreds,
// as in outlier channels) where the result itself is about 0, giving NaN or infinity.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    const scalar_t* gate = x + token * 2 * d;
    const scalar_t* up = gate + d;
    scalar_t* dst = out + token * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(gate[i]);
        const float product = static_cast<float>(gate[i] * up[i]);
        dst[i] = static_cast<scalar_t>(product / (1.0f + expf(-g)));
    }
}
