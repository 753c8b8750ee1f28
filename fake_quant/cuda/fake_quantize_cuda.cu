// CUDA fake-quant kernels: grid-stride loops over the shared scalar formulas, four elements per
// thread and step with 16-byte loads and stores where the pointers allow, one at a time for the
// tail.
#include "fake_quant/cuda/fake_quantize_cuda.h"

namespace qforge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < kMaxBlocks ? (b > 0 ? b : 1) : kMaxBlocks);
}

// Element ops: op(x, i, &in_range) for element i; four(...) for elements i0..i0+3, which lets an
// op look its grid up once per four elements when they share it.
struct PerTensorOp {
  fq::AffineGrid g;
  __device__ float operator()(float x, int64_t, bool* m) const { return fq::fake_quantize_value(x, g, m); }
  __device__ void four(const float4& x, int64_t, float4& y, bool* m) const {
    y.x = fq::fake_quantize_value(x.x, g, m);
    y.y = fq::fake_quantize_value(x.y, g, m + 1);
    y.z = fq::fake_quantize_value(x.z, g, m + 2);
    y.w = fq::fake_quantize_value(x.w, g, m + 3);
  }
};

struct PerChannelOp {
  const float* scale;
  const float* zero_point;
  float qmin, qmax;
  int64_t C, inner;
  bool inner_by_4;  // inner % 4 == 0: four aligned elements share one channel
  __device__ fq::AffineGrid grid(int64_t i) const {
    const int64_t c = (i / inner) % C;
    return fq::make_grid(scale[c], zero_point[c], qmin, qmax);
  }
  __device__ float operator()(float x, int64_t i, bool* m) const { return fq::fake_quantize_value(x, grid(i), m); }
  __device__ void four(const float4& x, int64_t i0, float4& y, bool* m) const {
    if (inner_by_4) {
      const fq::AffineGrid g = grid(i0);
      y.x = fq::fake_quantize_value(x.x, g, m);
      y.y = fq::fake_quantize_value(x.y, g, m + 1);
      y.z = fq::fake_quantize_value(x.z, g, m + 2);
      y.w = fq::fake_quantize_value(x.w, g, m + 3);
    } else {
      y.x = (*this)(x.x, i0, m);
      y.y = (*this)(x.y, i0 + 1, m + 1);
      y.z = (*this)(x.z, i0 + 2, m + 2);
      y.w = (*this)(x.w, i0 + 3, m + 3);
    }
  }
};

struct Float8Op {
  const float* scale;
  int64_t C, inner;
  bool inner_by_4;
  fq::Float8Format f;
  __device__ float s(int64_t i) const { return scale[(i / inner) % C]; }
  __device__ float operator()(float x, int64_t i, bool* m) const {
    return fq::fake_quantize_float8_value(x, s(i), f, m);
  }
  __device__ void four(const float4& x, int64_t i0, float4& y, bool* m) const {
    const float s0 = s(i0);
    y.x = fq::fake_quantize_float8_value(x.x, s0, f, m);
    y.y = fq::fake_quantize_float8_value(x.y, inner_by_4 ? s0 : s(i0 + 1), f, m + 1);
    y.z = fq::fake_quantize_float8_value(x.z, inner_by_4 ? s0 : s(i0 + 2), f, m + 2);
    y.w = fq::fake_quantize_float8_value(x.w, inner_by_4 ? s0 : s(i0 + 3), f, m + 3);
  }
};

// 16-byte loads and stores (four floats, four mask bytes per thread and step).
template <class Op>
__global__ void run4_kernel(const float* __restrict__ x, float* __restrict__ y, bool* __restrict__ mask, int64_t n4,
                            Op op) {
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < n4; v += int64_t{gridDim.x} * blockDim.x) {
    const float4 in = reinterpret_cast<const float4*>(x)[v];
    float4 out;
    bool m[4];
    op.four(in, v * 4, out, m);
    reinterpret_cast<float4*>(y)[v] = out;
    if (mask != nullptr) reinterpret_cast<uchar4*>(mask)[v] = make_uchar4(m[0], m[1], m[2], m[3]);
  }
}

// Elements [begin, n) one at a time: the tail, or unaligned pointers.
template <class Op>
__global__ void run1_kernel(const float* x, float* y, bool* mask, int64_t begin, int64_t n, Op op) {
  for (int64_t i = begin + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = op(x[i], i, mask != nullptr ? mask + i : nullptr);
}

bool aligned(const void* p, uintptr_t to) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % to == 0; }

template <class Op>
cudaError_t launch(const float* x, float* y, bool* mask, int64_t n, const Op& op, cudaStream_t stream) {
  const int64_t n4 = aligned(x, 16) && aligned(y, 16) && aligned(mask, 4) ? n / 4 : 0;
  if (n4 > 0) run4_kernel<<<blocks_for(n4), kThreads, 0, stream>>>(x, y, mask, n4, op);
  if (n > n4 * 4) run1_kernel<<<blocks_for(n - n4 * 4), kThreads, 0, stream>>>(x, y, mask, n4 * 4, n, op);
  return cudaGetLastError();
}

__global__ void backward4_kernel(const float* __restrict__ dy, const bool* __restrict__ mask, float* __restrict__ dx,
                                 int64_t n4) {
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < n4; v += int64_t{gridDim.x} * blockDim.x) {
    const float4 g = reinterpret_cast<const float4*>(dy)[v];
    const uchar4 m = reinterpret_cast<const uchar4*>(mask)[v];
    reinterpret_cast<float4*>(dx)[v] = make_float4(m.x ? g.x : 0.0f, m.y ? g.y : 0.0f, m.z ? g.z : 0.0f, m.w ? g.w : 0.0f);
  }
}

__global__ void backward1_kernel(const float* dy, const bool* mask, float* dx, int64_t begin, int64_t n) {
  for (int64_t i = begin + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dx[i] = mask[i] ? dy[i] : 0.0f;
}

}  // namespace

cudaError_t fake_quantize_per_tensor(const float* x, float* y, bool* mask, int64_t n,
                                     const fq::AffineGrid& grid, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return launch(x, y, mask, n, PerTensorOp{grid}, stream);
}

cudaError_t fake_quantize_per_channel(const float* x, float* y, bool* mask, int64_t n, int64_t C,
                                      int64_t inner, const float* scale, const float* zero_point,
                                      float quant_min, float quant_max, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (C <= 0 || inner <= 0) return cudaErrorInvalidValue;
  return launch(x, y, mask, n, PerChannelOp{scale, zero_point, quant_min, quant_max, C, inner, inner % 4 == 0},
                stream);
}

cudaError_t fake_quantize_float8(const float* x, float* y, bool* mask, int64_t n, int64_t C, int64_t inner,
                                 const float* scale, fq::Float8Format format, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (C <= 0 || inner <= 0) return cudaErrorInvalidValue;
  return launch(x, y, mask, n, Float8Op{scale, C, inner, inner % 4 == 0, format}, stream);
}

cudaError_t fake_quantize_backward(const float* dy, const bool* mask, float* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t n4 = aligned(dy, 16) && aligned(dx, 16) && aligned(mask, 4) ? n / 4 : 0;
  if (n4 > 0) backward4_kernel<<<blocks_for(n4), kThreads, 0, stream>>>(dy, mask, dx, n4);
  if (n > n4 * 4) backward1_kernel<<<blocks_for(n - n4 * 4), kThreads, 0, stream>>>(dy, mask, dx, n4 * 4, n);
  return cudaGetLastError();
}

}  // namespace qforge::cuda
