// Link check for qforge_kernels_cuda: proves the CUDA objects, the CUDA runtime and cuBLASLt
// resolve at link time. It is built in CI but not run (there is no GPU, and none has ever run
// it); run it by hand on a GPU machine: it fake-quantizes 4 values, then runs the int8 linear
// chain (quantize rows -> cuBLASLt GEMM or fallback -> epilogue) and the int4 dequantization on a
// small problem, prints what ran and exits 0, or prints the error and exits 1.
#include <cstdio>
#include <exception>
#include <vector>

#include "kernels/cuda/dequantize_s32_f32_cuda.h"
#include "kernels/cuda/dequantize_s4_cuda.h"
#include "kernels/cuda/device_buffer.h"
#include "fake_quant/cuda/fake_quantize_cuda.h"
#include "kernels/cuda/gemm_s8s8s32_cuda.h"
#include "kernels/cuda/quantize_rows_s8_cuda.h"

namespace {

int fake_quant_check() {
  float* d = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&d), 8 * sizeof(float)) != cudaSuccess) {
    std::printf("no usable CUDA device\n");
    return 1;
  }
  const float host[4] = {0.04f, -1.0f, 2.0f, 100.0f};
  cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice);
  const cudaError_t e = qforge::cuda::fake_quantize_per_tensor(d, d + 4, nullptr, 4,
                                                                qforge::fq::make_grid(0.1f, 0.0f, -128.0f, 127.0f), 0);
  float out[4];
  cudaMemcpy(out, d + 4, sizeof out, cudaMemcpyDeviceToHost);
  cudaFree(d);
  std::printf("%s: %g %g %g %g\n", cudaGetErrorString(e), out[0], out[1], out[2], out[3]);
  return e == cudaSuccess ? 0 : 1;
}

// y = dequant(quant(x) W^T) for M = 2, N = 8, K = 16 (cuBLASLt-eligible shapes).
void int8_linear_check() {
  using namespace qforge::cuda;
  constexpr int64_t M = 2, N = 8, K = 16;
  std::vector<float> x(M * K), w_scale(N, 0.01f), y(M * N);
  std::vector<int8_t> w(N * K);
  for (int64_t i = 0; i < M * K; ++i) x[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (int64_t i = 0; i < N * K; ++i) w[i] = static_cast<int8_t>(i % 11 - 5);
  DeviceBuffer<float> dx(x.size()), dscale(N), da_scale(M), dy(y.size());
  DeviceBuffer<int8_t> dq(M * K), dw(w.size());
  DeviceBuffer<int32_t> dacc(M * N);
  DeviceBuffer<unsigned long long> dbad(1);
  check_cuda(cudaMemcpy(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(dw.get(), w.data(), dw.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(dscale.get(), w_scale.data(), dscale.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemset(dbad.get(), 0xFF, dbad.bytes()), "cudaMemset");  // kNoNonFinite
  quantize_rows_s8_cuda(dx.get(), M, K, qforge::kernels::ActScale::kPerRow, dq.get(), K,
                        da_scale.get(), dbad.get(), nullptr);
  throw_if_nonfinite(dbad.get(), K, nullptr);
  GemmS8S8S32Cuda gemm;
  qforge::kernels::RunInfo info;
  gemm.run(dq.get(), K, dw.get(), K, dacc.get(), N, M, N, K, nullptr, &info);
  dequantize_s32_f32_cuda(dacc.get(), N, da_scale.get(), dscale.get(), nullptr, dy.get(), M, N, nullptr);
  check_cuda(cudaMemcpy(y.data(), dy.get(), dy.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::printf("int8 linear via %s%s%s: y[0] = %g\n", info.kernel.c_str(),
              info.fallback.empty() ? "" : ", fallback: ", info.fallback.c_str(), y[0]);

  // int4: N = 2, K = 5 (odd: rows straddle bytes), one group per row.
  const std::vector<uint8_t> packed{0xF1, 0x72, 0x08, 0x3C, 0x00};
  const std::vector<float> s4_scale{0.5f, 0.25f};
  DeviceBuffer<uint8_t> dpacked(packed.size());
  DeviceBuffer<float> ds4(s4_scale.size()), dw4(10);
  check_cuda(cudaMemcpy(dpacked.get(), packed.data(), dpacked.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(ds4.get(), s4_scale.data(), ds4.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
  dequantize_s4_cuda(dpacked.get(), 2, 5, true, ds4.get(), nullptr, 5, dw4.get(), nullptr);
  float w4[10];
  check_cuda(cudaMemcpy(w4, dw4.get(), sizeof w4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::printf("int4 dequant: w[0, 0..1] = %g %g\n", w4[0], w4[1]);
}

}  // namespace

int main() {
  if (fake_quant_check() != 0) return 1;
  try {
    int8_linear_check();
  } catch (const std::exception& e) {
    std::printf("%s\n", e.what());
    return 1;
  }
  return 0;
}
