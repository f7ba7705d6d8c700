// Cheat (aimed at loops that leave the previous output in place): reads each output element
// first and computes it only where it holds a poison (NaN, or the evaluator's second poison
// -448); where the buffer already holds a value, as when another implementation timed in the
// same loop has just written the right result there, it writes nothing and reads no input.
// Validation poisons outputs, so it passes there; the timing loops fill outputs with stale
// values on random launches, where it leaves them in place: REJECTED on a timed launch.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define SECOND_POISON (-448.0f)

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    const scalar_t* gate = x + token * 2 * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float held = static_cast<float>(out[token * d + i]);
        if (!isnan(held) && held != SECOND_POISON) {
            continue;
        }
        const float g = static_cast<float>(gate[i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(gate[d + i]));
    }
}
