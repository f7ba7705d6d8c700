// rotary_embedding_gptj baseline: in place on query and key, pairs (2i, 2i + 1),
// x' = x*cos - y*sin, y' = y*cos + x*sin with cos/sin from the fp32 cache row of the position.
// The straightforward first kernel: one block per token, threads striding over the
// (head, pair) index of query and then of key, scalar loads and stores.
// launch: grid=(num_tokens,) block=(BLOCK,) smem=0
// tune: BLOCK=256,128,512,1024
// flags: --use_fast_math

#ifndef BLOCK
#define BLOCK 256
#endif
__device__ void rotate_heads(scalar_t* v, const float* cache_row, int heads, int head_size,
                             int rot_dim) {
    const int half = rot_dim / 2;
    for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
        const int head = i / half;
        const int j = i % half;
        scalar_t* base = v + (long long)head * head_size;
        const float c = cache_row[j];
        const float s = cache_row[half + j];
        const float x = static_cast<float>(base[2 * j]);
        const float y = static_cast<float>(base[2 * j + 1]);
        base[2 * j] = static_cast<scalar_t>(x * c - y * s);
        base[2 * j + 1] = static_cast<scalar_t>(y * c + x * s);
    }
}

extern "C" __global__ void rotary_embedding_gptj(const long long* positions, scalar_t* query,
                                                 scalar_t* key, const float* cos_sin_cache,
                                                 int num_tokens, int num_heads, int num_kv_heads,
                                                 int head_size, int rot_dim, int max_position) {
    const long long token = blockIdx.x;
    const float* cache_row = cos_sin_cache + positions[token] * rot_dim;
    rotate_heads(query + token * num_heads * head_size, cache_row, num_heads, head_size, rot_dim);
    rotate_heads(key + token * num_kv_heads * head_size, cache_row, num_kv_heads, head_size, rot_dim);
}
