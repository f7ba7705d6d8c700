// transpose_2d baseline: out[j, i] = x[i, j].
// The straightforward first kernel: one thread per element of out, reading x with a stride
// of cols (uncoalesced reads, coalesced writes).
// launch: grid=(cdiv(rows * cols, 256),) block=(256,) smem=0

extern "C" __global__ void transpose_2d(scalar_t* out, const scalar_t* x, int rows, int cols) {
    const long long k = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (k >= static_cast<long long>(rows) * cols) return;
    const long long j = k / rows;  // out row = x column
    const long long i = k % rows;
    out[k] = x[i * cols + j];
}
