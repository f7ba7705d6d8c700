// Attack (on the loop that times winners beside the production peers): traps when its output
// buffer does not hold a poison (NaN, or the evaluator's second poison -448) at the start of
// its row. Validation poisons outputs, so it passes there; the timing loops fill outputs with
// stale values on random launches, where it faults: a CRASH verdict for it alone (a harness
// that treated the fault as its own failure would end the run for every other kernel).
// launch: grid=(num_tokens,) block=(256,) smem=0

#define SECOND_POISON (-448.0f)

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    const float held = static_cast<float>(out[token * d]);
    __syncthreads();  // every thread has read the marker before any thread writes the row
    if (!isnan(held) && held != SECOND_POISON) {
        __trap();
    }
    const scalar_t* gate = x + token * 2 * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(gate[i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(gate[d + i]));
    }
}
