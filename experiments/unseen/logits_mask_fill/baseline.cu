// logits_mask_fill baseline: out = mask ? x : fill, elementwise.
// The straightforward first kernel: one thread per element, scalar loads, 64-bit index.
// launch: grid=(cdiv(num_tokens * vocab, 256),) block=(256,) smem=0

extern "C" __global__ void logits_mask_fill(scalar_t* out, const scalar_t* x, const unsigned char* mask,
                                            int num_tokens, int vocab, float fill) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<long long>(num_tokens) * vocab) return;
    out[i] = mask[i] != 0 ? x[i] : static_cast<scalar_t>(fill);
}
