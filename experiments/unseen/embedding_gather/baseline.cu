// embedding_gather baseline: out[t, :] = weight[ids[t], :].
// The straightforward first kernel: one block per token, threads striding over the row with
// scalar loads and stores.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void embedding_gather(scalar_t* out, const scalar_t* weight, const int* ids,
                                            int num_tokens, int hidden, int vocab) {
    const long long token = blockIdx.x;
    const scalar_t* src = weight + static_cast<long long>(ids[token]) * hidden;
    scalar_t* dst = out + token * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}
