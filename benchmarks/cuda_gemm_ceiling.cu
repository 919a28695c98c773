// What MLX's f16 steel GEMM structure can reach on an NVIDIA GPU, written by hand.
//
// The tiling is the one benchmarks/cuda_kernels.py launches (steel_gemm_fused_nn_float16,
// bm64 bn64 bk16, 2x2 SIMD-groups = 4 warps of 32, each warp a 32x32 block of 4x4 8x8
// fragments interleaved 16 rows / 16 columns apart, threadgroup tiles padded by 8 halves:
// A 64x24, B 16x72), each thread copying 16 bytes of A and 16 of B per 16-deep step.
// Variants:
//   sync_k16   MLX's structure: synchronous global->shared copies, 2 barriers per step,
//              fragments by ldmatrix (.trans for B), mma.sync m16n8k16, f32 sums
//   sync_k8    the same with two m16n8k8 per 16-deep step (what our lowering issues)
//   async_k16  the same tiles double-buffered with cp.async, 1 barrier per step
// A check: every variant's result against a plain f32 kernel (max |diff| / sqrt(K)).
//
// Build: nvcc -O3 -arch=sm_90 -o cuda_gemm_ceiling cuda_gemm_ceiling.cu
// Usage: ./cuda_gemm_ceiling N [N ...]   (N a multiple of 64; prints one line per variant)

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int BM = 64, BN = 64, BK = 16, PAD = 8;
constexpr int LDA = BK + PAD, LDB = BN + PAD;  // threadgroup row strides (halves)
constexpr int THREADS = 128;

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

__device__ __forceinline__ void mma_k16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                        unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_k8(float (&d)[4], unsigned a0, unsigned a1, unsigned b0) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ void cp_async16(half* dst, const half* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(dst)), "l"(src));
}

// One 16-deep step of a warp's 32x32 block. acc[p][n]: m16 pair p (fragments p and p+2
// of the warp's four 8-row fragments: rows wm*8 + 16p + {0..7} and +32), n8 column n.
template <bool K16>
__device__ __forceinline__ void warp_step(float (&acc)[2][4][4], const half* As, const half* Bs, int wm, int wn,
                                          int lane) {
  // A: matrix q of ldmatrix.x4 is lane group q = lane/8; rows of fragment (p + 2*(q&1)),
  // k half (q>>1): a0 = rows 0-7 k 0-7, a1 = rows 8-15 k 0-7, a2 = rows 0-7 k 8-15, a3 = rows 8-15 k 8-15.
  unsigned a[2][4], b[2][4];
  const int q = lane >> 3, r = lane & 7;
  for (int p = 0; p < 2; ++p) {
    const int row = wm * 8 + 16 * p + 32 * (q & 1) + r;
    ldmatrix_x4(a[p], As + row * LDA + 8 * (q >> 1));
  }
  // B (k x n, row-major): .trans gives mma's column fragments; matrix q = k half (q&1) of n8 column (2h + (q>>1)).
  for (int h = 0; h < 2; ++h) {
    const int col = wn * 8 + 16 * (2 * h + (q >> 1));
    ldmatrix_x4_trans(b[h], Bs + (8 * (q & 1) + r) * LDB + col);
  }
  for (int p = 0; p < 2; ++p)
    for (int n = 0; n < 4; ++n) {
      const unsigned b0 = b[n >> 1][2 * (n & 1)], b1 = b[n >> 1][2 * (n & 1) + 1];
      if (K16) {
        mma_k16(acc[p][n], a[p][0], a[p][1], a[p][2], a[p][3], b0, b1);
      } else {
        mma_k8(acc[p][n], a[p][0], a[p][1], b0);
        mma_k8(acc[p][n], a[p][2], a[p][3], b1);
      }
    }
}

__device__ __forceinline__ void store_block(const float (&acc)[2][4][4], half* D, int n, int m0, int n0, int wm,
                                            int wn, int lane) {
  const int g = lane >> 2, t = lane & 3;
  for (int p = 0; p < 2; ++p)
    for (int j = 0; j < 4; ++j)
      for (int half_ = 0; half_ < 2; ++half_) {
        const int row = m0 + wm * 8 + 16 * p + 32 * half_ + g, col = n0 + wn * 8 + 16 * j + 2 * t;
        *reinterpret_cast<__half2*>(D + static_cast<size_t>(row) * n + col) =
            __floats2half2_rn(acc[p][j][2 * half_], acc[p][j][2 * half_ + 1]);
      }
}

template <bool K16>
__global__ void __launch_bounds__(THREADS) gemm_sync(const half* A, const half* B, half* D, int n) {
  __shared__ __align__(16) half As[BM * LDA];
  __shared__ __align__(16) half Bs[BK * LDB];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp / 2, wn = warp % 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int ar = tid >> 1, ac = (tid & 1) * 8, br = tid >> 3, bc = (tid & 7) * 8;
  const half* a_src = A + static_cast<size_t>(m0 + ar) * n + ac;
  const half* b_src = B + static_cast<size_t>(br) * n + n0 + bc;
  float acc[2][4][4] = {};
  for (int k = 0; k < n; k += BK) {
    __syncthreads();
    *reinterpret_cast<int4*>(As + ar * LDA + ac) = *reinterpret_cast<const int4*>(a_src + k);
    *reinterpret_cast<int4*>(Bs + br * LDB + bc) = *reinterpret_cast<const int4*>(b_src + static_cast<size_t>(k) * n);
    __syncthreads();
    warp_step<K16>(acc, As, Bs, wm, wn, lane);
  }
  store_block(acc, D, n, m0, n0, wm, wn, lane);
}

__global__ void __launch_bounds__(THREADS) gemm_async(const half* A, const half* B, half* D, int n) {
  __shared__ __align__(16) half As[2][BM * LDA];
  __shared__ __align__(16) half Bs[2][BK * LDB];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp / 2, wn = warp % 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int ar = tid >> 1, ac = (tid & 1) * 8, br = tid >> 3, bc = (tid & 7) * 8;
  const half* a_src = A + static_cast<size_t>(m0 + ar) * n + ac;
  const half* b_src = B + static_cast<size_t>(br) * n + n0 + bc;
  float acc[2][4][4] = {};
  cp_async16(As[0] + ar * LDA + ac, a_src);
  cp_async16(Bs[0] + br * LDB + bc, b_src);
  asm volatile("cp.async.commit_group;");
  int stage = 0;
  for (int k = 0; k < n; k += BK) {
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();  // this stage landed for everyone; everyone is done with the other one
    if (k + BK < n) {
      cp_async16(As[stage ^ 1] + ar * LDA + ac, a_src + k + BK);
      cp_async16(Bs[stage ^ 1] + br * LDB + bc, b_src + static_cast<size_t>(k + BK) * n);
    }
    asm volatile("cp.async.commit_group;");
    warp_step<true>(acc, As[stage], Bs[stage], wm, wn, lane);
    stage ^= 1;
  }
  store_block(acc, D, n, m0, n0, wm, wn, lane);
}

__global__ void gemm_reference(const half* A, const half* B, float* D, int n) {
  const int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  float sum = 0.f;
  for (int k = 0; k < n; ++k)
    sum += __half2float(A[static_cast<size_t>(row) * n + k]) * __half2float(B[static_cast<size_t>(k) * n + col]);
  D[static_cast<size_t>(row) * n + col] = sum;
}

__global__ void fill(half* x, size_t count, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = __float2half(static_cast<float>(h & 0xffff) / 32768.f - 1.f);
  }
}

#define CHECK(call)                                                                       \
  do {                                                                                    \
    cudaError_t e = (call);                                                               \
    if (e != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));      \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

template <typename Launch>
static float median_ms(Launch launch, int calls) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> samples;
  for (int repeat = 0; repeat < 7; ++repeat) {
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < calls; ++i) launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms / calls);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

int main(int argc, char** argv) {
  for (int arg = 1; arg < argc; ++arg) {
    const int n = std::atoi(argv[arg]);
    const size_t count = static_cast<size_t>(n) * n;
    half *A, *B, *D;
    float* R;
    CHECK(cudaMalloc(&A, count * sizeof(half)));
    CHECK(cudaMalloc(&B, count * sizeof(half)));
    CHECK(cudaMalloc(&D, count * sizeof(half)));
    CHECK(cudaMalloc(&R, count * sizeof(float)));
    fill<<<1024, 256>>>(A, count, 1u);
    fill<<<1024, 256>>>(B, count, 2u);
    gemm_reference<<<dim3(n / 16, n / 16), dim3(16, 16)>>>(A, B, R, n);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> want(count);
    std::vector<half> got(count);
    CHECK(cudaMemcpy(want.data(), R, count * sizeof(float), cudaMemcpyDeviceToHost));
    const dim3 grid(n / BN, n / BM);
    const int calls = std::max(1, static_cast<int>(20.0 * 4096 * 4096 * 4096 / (static_cast<double>(n) * n * n)));
    struct Variant {
      const char* name;
      void (*kernel)(const half*, const half*, half*, int);
    } variants[] = {{"sync_k16", gemm_sync<true>}, {"sync_k8", gemm_sync<false>}, {"async_k16", gemm_async}};
    for (const Variant& v : variants) {
      const float ms = median_ms([&] { v.kernel<<<grid, THREADS>>>(A, B, D, n); }, calls);
      CHECK(cudaGetLastError());
      CHECK(cudaMemcpy(got.data(), D, count * sizeof(half), cudaMemcpyDeviceToHost));
      double worst = 0;
      for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(double(__half2float(got[i])) - want[i]));
      cudaFuncAttributes attributes;
      CHECK(cudaFuncGetAttributes(&attributes, v.kernel));
      std::printf("%s n=%d ms=%.4f tflops=%.1f regs=%d max_diff_over_sqrtk=%.3e\n", v.name, n, ms,
                  2.0 * n * n * n / (ms * 1e-3) / 1e12, attributes.numRegs, worst / std::sqrt(double(n)));
    }
    CHECK(cudaFree(A));
    CHECK(cudaFree(B));
    CHECK(cudaFree(D));
    CHECK(cudaFree(R));
  }
  return 0;
}
