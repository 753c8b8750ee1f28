// Link check for qforge_kernels_cuda: proves the CUDA objects and runtime resolve at link time.
// It is built in CI but not run (there is no GPU); run it by hand on a GPU machine: it exits 0
// after fake-quantizing 4 values on the device, or prints the CUDA error.
#include <cstdio>

#include "kernels/cuda/fake_quantize_cuda.h"

int main() {
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
