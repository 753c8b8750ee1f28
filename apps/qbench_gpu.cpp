// qbench_gpu: qforge's CUDA kernels beside the GPU's own ceilings, in one run.
//   - int8 GEMM (GemmS8S8S32Cuda: cuBLASLt IMMA, as a frozen Linear calls it) beside cuBLASLt's
//     fp16 and bf16 GEMMs on the same shapes (BERT-base's Linear shapes at several M, and 4096^3),
//     the whole int8 Linear chain (quantize rows + GEMM + epilogue) and the one-launch fused
//     Linear (linear_s8_fused_cuda, every tile; '*' marks the dispatch rule's);
//   - the int4 weight-only GEMVs (gemv_f32s4_mma_cuda and gemv_f32s4_mma_staged_cuda on tensor
//     cores, on the dense codes and on the tiled codes frozen layers keep, gemv_f32s4_cuda on CUDA
//     cores; g128, float activations) beside cuBLASLt's fp16 GEMM at decode sizes (M = 1, 4, 8,
//     16) on 4096x4096 and Llama-3-8B's FFN shapes; the int8 weight-only GEMV (gemv_f32s8_cuda)
//     on the same shapes; every GEMV row also as a CUDA-graph replay ("_graph": no host launch
//     cost, as a captured decode step runs) against fp16's replay;
//   - fake-quant kernels' (and LSQ's backward's) GB/s beside a device-to-device cudaMemcpy's.
// Regime: every timed call reads a different copy of its operands, rotating through at least
// 256 MiB, so weights do not sit in the L2 between calls (a model's weights between tokens).
// Times are CUDA-event medians over repetitions after a warm-up. Needs only the CUDA toolkit.
//   qbench_gpu [--quick] [--json FILE] [--filter SECTION]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fake_quant/cuda/fake_quantize_cuda.h"
#include "fake_quant/cuda/lsq_backward_cuda.h"
#include "kernels/cuda/cublaslt_handles.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequantize_s32_f32_cuda.h"
#include "kernels/cuda/dequantize_s4_cuda.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm_s8s8s32_cuda.h"
#include "kernels/cuda/gemv_f32s4_cuda.h"
#include "kernels/cuda/gemv_f32s4_mma_cuda.h"
#include "kernels/cuda/gemv_f32s8_cuda.h"
#include "kernels/cuda/linear_s8_fused_cuda.h"
#include "kernels/cuda/quantize_rows_s8_cuda.h"
#include "kernels/cuda/unpack_s4_math.h"

namespace {

using namespace qforge::cuda;

constexpr size_t kRotateBytes = size_t{256} << 20;  // several times any L2 (H100: 50 MB)

struct Timer {
  cudaEvent_t a = nullptr, b = nullptr;
  Timer() {
    check_cuda(cudaEventCreate(&a), "cudaEventCreate");
    check_cuda(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  // Median over `reps` of the time of `calls` calls of fn(i) (i = 0..calls-1), per call, in ms.
  double median_ms(int reps, int calls, const std::function<void(int)>& fn) {
    for (int i = 0; i < calls; ++i) fn(i);  // warm-up: module load, handles, heuristics
    check_cuda(cudaDeviceSynchronize(), "warm-up");
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      check_cuda(cudaEventRecord(a), "cudaEventRecord");
      for (int i = 0; i < calls; ++i) fn(i);
      check_cuda(cudaEventRecord(b), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
      t.push_back(ms / calls);
    }
    check_cuda(cudaGetLastError(), "kernels");
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  // The same calls captured once into a CUDA graph on a stream of their own and replayed `reps`
  // times: the device's time per call without the host's launch cost (a decode step replayed as
  // a graph), in ms.
  double median_graph_ms(int reps, int calls, const std::function<void(int, cudaStream_t)>& fn) {
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::vector<double> t;
    try {
      for (int i = 0; i < calls; ++i) fn(i, stream);  // warm-up outside the capture (heuristics, modules)
      check_cuda(cudaStreamSynchronize(stream), "warm-up");
      check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      for (int i = 0; i < calls; ++i) fn(i, stream);
      check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
      check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
      check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      check_cuda(cudaStreamSynchronize(stream), "graph warm-up");
      for (int r = 0; r < reps; ++r) {
        check_cuda(cudaEventRecord(a, stream), "cudaEventRecord");
        check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
        check_cuda(cudaEventRecord(b, stream), "cudaEventRecord");
        check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
        float ms = 0;
        check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
        t.push_back(ms / calls);
      }
    } catch (...) {
      // A call that threw inside the capture leaves it open: end it before the stream goes.
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &capturing) == cudaSuccess && capturing != cudaStreamCaptureStatusNone) {
        cudaGraph_t partial = nullptr;
        cudaStreamEndCapture(stream, &partial);
        if (partial != nullptr) cudaGraphDestroy(partial);
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
      throw;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  // Eager (median_ms on the default stream) and graph (median_graph_ms) times of the same calls.
  std::pair<double, double> eager_and_graph_ms(int reps, int calls, const std::function<void(int, cudaStream_t)>& fn) {
    const double eager = median_ms(reps, calls, [&](int i) { fn(i, nullptr); });
    return {eager, median_graph_ms(reps, calls, fn)};
  }
};

// Random bytes on the device (a host pattern uploaded once, then replicated).
template <class T>
void fill_random(DeviceBuffer<T>& d, uint32_t seed, const std::function<T(std::mt19937&)>& gen) {
  const size_t n = d.size();
  const size_t chunk = std::min<size_t>(n, size_t{1} << 22);
  std::mt19937 rng(seed);
  std::vector<T> h(chunk);
  for (auto& v : h) v = gen(rng);
  for (size_t off = 0; off < n; off += chunk) {
    const size_t c = std::min(chunk, n - off);
    check_cuda(cudaMemcpy(d.get() + off, h.data(), c * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
}

int8_t rand_s8(std::mt19937& r) { return static_cast<int8_t>(static_cast<int>(r() % 255) - 127); }
float rand_f(std::mt19937& r) { return std::uniform_real_distribution<float>(-2.0f, 2.0f)(r); }

struct Row {
  std::string bench, shape, impl;
  double ms = 0, rate = 0;  // rate: TFLOP/s (TOP/s for int8) or GB/s
  std::string unit;
  double vs = 0;  // ratio to the row's baseline (fp16 GEMM, memcpy), 0 when none
};
std::vector<Row> g_rows;

void print_row(const Row& r) {
  std::printf("%-18s %-22s %-30s %9.4f %9.1f %-7s", r.bench.c_str(), r.shape.c_str(), r.impl.c_str(), r.ms, r.rate,
              r.unit.c_str());
  if (r.vs > 0) std::printf(" x%.2f", r.vs);
  std::printf("\n");
  std::fflush(stdout);
  g_rows.push_back(r);
}

// A cuBLASLt float GEMM in the same TN form as the int8 one: C[M, N] = A[M, K] W[N, K]^T,
// row-major, fp32 accumulation and scale, output in the input type. Algorithm chosen once.
class FloatGemm {
 public:
  FloatGemm(cublasLtHandle_t h, cudaDataType_t type, int64_t M, int64_t N, int64_t K, size_t workspace)
      : h_(h), desc_(CUBLAS_COMPUTE_32F, CUDA_R_32F), w_(type, K, N, K), a_(type, K, M, K), c_(type, N, M, N) {
    desc_.set(CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t{CUBLAS_OP_T});
    desc_.set(CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t{CUBLAS_OP_N});
    LtMatmulPreference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{workspace});
    int found = 0;
    check_cublas(cublasLtMatmulAlgoGetHeuristic(h_, desc_.get(), w_.get(), a_.get(), c_.get(), c_.get(), pref.get(), 1,
                                                &heur_, &found),
                 "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) throw qforge::Error("no cuBLASLt algorithm for the float GEMM");
  }
  void run(const void* A, const void* W, void* C, void* ws, size_t ws_bytes, cudaStream_t stream = nullptr) {
    const float alpha = 1.0f, beta = 0.0f;
    check_cublas(cublasLtMatmul(h_, desc_.get(), &alpha, W, w_.get(), A, a_.get(), &beta, C, c_.get(), C, c_.get(),
                                &heur_.algo, ws, ws_bytes, stream),
                 "cublasLtMatmul");
  }

 private:
  cublasLtHandle_t h_;
  LtMatmulDesc desc_;
  LtMatrixLayout w_, a_, c_;
  cublasLtMatmulHeuristicResult_t heur_{};
};

struct Shape {
  int64_t M, N, K;
  const char* note;
};

int copies_for(size_t bytes_per_set) {
  return static_cast<int>(std::clamp<size_t>((kRotateBytes + bytes_per_set - 1) / bytes_per_set, 1, 64));
}

// A cuBLASLt fp16 or bf16 GEMM on rotating operands (random values in [-2, 2)): its ms, eager,
// and as a graph replay when `graph` is given.
double float_gemm_ms(const Shape& s, cudaDataType_t type, int reps, Timer& timer, cublasLtHandle_t lt,
                     double* graph = nullptr) {
  constexpr size_t kWs = size_t{32} << 20;
  DeviceBuffer<unsigned char> ws(kWs);
  const size_t set = static_cast<size_t>((s.M * s.K + s.N * s.K + s.M * s.N) * 2);
  const int R = copies_for(set);
  DeviceBuffer<uint16_t> A(s.M * s.K * R), W(s.N * s.K * R), C(s.M * s.N * R);
  // Their bit patterns as 16-bit words.
  const auto gen16 = [type](std::mt19937& r) {
    const float f = rand_f(r);
    uint16_t b;
    if (type == CUDA_R_16F) {
      const __half h = __float2half(f);
      std::memcpy(&b, &h, 2);
    } else {
      const __nv_bfloat16 h = __float2bfloat16(f);
      std::memcpy(&b, &h, 2);
    }
    return b;
  };
  fill_random<uint16_t>(A, 1, gen16);
  fill_random<uint16_t>(W, 2, gen16);
  FloatGemm g(lt, type, s.M, s.N, s.K, kWs);
  const auto call = [&](int i, cudaStream_t stream) {
    g.run(A.get() + i * s.M * s.K, W.get() + i * s.N * s.K, C.get() + i * s.M * s.N, ws.get(), kWs, stream);
  };
  if (graph == nullptr) return timer.median_ms(reps, R, [&](int i) { call(i, nullptr); });
  const auto [eager, replayed] = timer.eager_and_graph_ms(reps, R, call);
  *graph = replayed;
  return eager;
}

// The rows of one shape; returns the fp16 GEMM's ms (the ratio baseline of the fused rows).
double bench_gemm(const Shape& s, int reps, Timer& timer, cublasLtHandle_t lt, bool chain) {
  const std::string shape = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
  const double flops = 2.0 * static_cast<double>(s.M) * s.N * s.K;

  // fp16 and bf16 baselines.
  double fp16_ms = 0;
  for (const cudaDataType_t type : {CUDA_R_16F, CUDA_R_16BF}) {
    const double ms = float_gemm_ms(s, type, reps, timer, lt);
    if (type == CUDA_R_16F) fp16_ms = ms;
    print_row({"gemm", shape, type == CUDA_R_16F ? "cublasLt fp16" : "cublasLt bf16", ms, flops / ms / 1e9, "TFLOP/s",
               fp16_ms / ms});
  }

  // int8 through qforge's dispatcher (cuBLASLt IMMA).
  const size_t set8 = static_cast<size_t>(s.M * s.K + s.N * s.K + s.M * s.N * 4);
  const int R = copies_for(set8);
  DeviceBuffer<int8_t> A(s.M * s.K * R), W(s.N * s.K * R);
  DeviceBuffer<int32_t> C(s.M * s.N * R);
  fill_random<int8_t>(A, 2, rand_s8);
  fill_random<int8_t>(W, 3, rand_s8);
  GemmS8S8S32Cuda gemm;
  qforge::kernels::RunInfo info;
  const double ms8 = timer.median_ms(reps, R, [&](int i) {
    gemm.run(A.get() + i * s.M * s.K, s.K, W.get() + i * s.N * s.K, s.K, C.get() + i * s.M * s.N, s.N, s.M, s.N, s.K,
             nullptr, &info);
  });
  print_row({"gemm", shape, "qforge int8 (" + info.kernel + ")", ms8, flops / ms8 / 1e9, "TOP/s", fp16_ms / ms8});

  if (!chain) return fp16_ms;
  // The frozen s8-dynamic Linear: float x -> quantize rows -> int8 GEMM -> epilogue -> float y.
  DeviceBuffer<float> X(s.M * s.K * R), Y(s.M * s.N), a_scale(s.M), w_scale(s.N), bias(s.N);
  DeviceBuffer<int8_t> Q(s.M * s.K);
  DeviceBuffer<int32_t> acc(s.M * s.N);
  fill_random<float>(X, 4, rand_f);
  fill_random<float>(w_scale, 5, [](std::mt19937& r) { return 0.001f + 0.01f * std::uniform_real_distribution<float>()(r); });
  fill_random<float>(bias, 6, rand_f);
  const double msc = timer.median_ms(reps, R, [&](int i) {
    quantize_rows_s8_cuda(X.get() + i * s.M * s.K, s.M, s.K, qforge::kernels::ActScale::kPerRow, Q.get(), s.K,
                          a_scale.get(), nullptr, nullptr);
    gemm.run(Q.get(), s.K, W.get() + i * s.N * s.K, s.K, acc.get(), s.N, s.M, s.N, s.K, nullptr, &info);
    dequantize_s32_f32_cuda(acc.get(), s.N, a_scale.get(), w_scale.get(), bias.get(), Y.get(), s.M, s.N, nullptr);
  });
  print_row({"linear_s8_dynamic", shape, "qforge quantize+int8+epilogue", msc, flops / msc / 1e9, "TOP/s", fp16_ms / msc});
  return fp16_ms;
}

// The one-launch frozen s8-dynamic Linear (float x -> float y) with every tile the device
// allows, and at M <= kFusedMaxM the 16 x 64 tile in 2 and 4 K slices, on rotating x and W,
// beside the fp16 GEMM of the same shape; '*' marks the dispatch's choice (none above
// kFusedMaxM: the chain serves it), whose static-codes form (int8 x given) is timed once.
void bench_linear_fused(const Shape& s, int reps, Timer& timer, double fp16_ms) {
  const std::string shape = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
  const double flops = 2.0 * static_cast<double>(s.M) * s.N * s.K;
  const size_t set = static_cast<size_t>(s.M * s.K * 4 + s.N * s.K + s.M * s.N * 4);
  const int R = copies_for(set);
  DeviceBuffer<float> X(s.M * s.K * R), Y(s.M * s.N * R), w_scale(s.N), bias(s.N);
  DeviceBuffer<int8_t> W(s.N * s.K * R), Q(s.M * s.K * R);
  DeviceBuffer<int32_t> work(std::max({fused_workspace_ints(s.M, s.N, s.K, 2), fused_workspace_ints(s.M, s.N, s.K, 4),
                                       int64_t{1}}));
  DeviceBuffer<unsigned> tickets(fused_ticket_count(FusedTile::k16x64, s.M, s.N));
  check_cuda(cudaMemset(tickets.get(), 0, tickets.size() * sizeof(unsigned)), "cudaMemset");
  fill_random<float>(X, 4, rand_f);
  fill_random<int8_t>(W, 3, rand_s8);
  fill_random<int8_t>(Q, 2, rand_s8);
  fill_random<float>(w_scale, 5, [](std::mt19937& r) { return 0.001f + 0.01f * std::uniform_real_distribution<float>()(r); });
  fill_random<float>(bias, 6, rand_f);
  LinearS8FusedArgs a;
  a.w_scale = w_scale.get();
  a.bias = bias.get();
  a.M = s.M, a.N = s.N, a.K = s.K;
  a.workspace = work.get();
  a.tickets = tickets.get();
  const bool dispatched = s.M <= kFusedMaxM;
  const FusedTile chosen = fused_tile_for(s.M, s.K);
  const int64_t chosen_splits = fused_splits_for(chosen, s.N, s.K);
  const auto time_tile = [&](FusedTile t, int64_t splits, bool dynamic) {
    return timer.median_ms(reps, R, [&](int i) {
      LinearS8FusedArgs c = a;
      c.x = dynamic ? X.get() + i * s.M * s.K : nullptr;
      c.codes = dynamic ? nullptr : Q.get() + i * s.M * s.K;
      c.static_scale = 0.02f;
      c.weight = W.get() + i * s.N * s.K;
      c.y = Y.get() + i * s.M * s.N;
      c.splits = splits;
      linear_s8_fused_cuda(c, t, nullptr);
    });
  };
  const auto name = [&](FusedTile t, int64_t splits) {
    return std::string("qforge fused ") + fused_tile_name(t) + (splits > 1 ? " K/" + std::to_string(splits) : "");
  };
  for (int ti = 0; ti < kFusedTileCount; ++ti)
    for (const int64_t splits : {int64_t{1}, int64_t{2}, int64_t{4}}) {
      const auto t = static_cast<FusedTile>(ti);
      if ((splits > 1 && (t != FusedTile::k16x64 || !dispatched || fused_effective_splits(s.K, splits) != splits)) ||
          !linear_s8_fused_supported(s.M, s.N, s.K, t, linear_s8_fused_max_smem(), nullptr, splits))
        continue;
      const double ms = time_tile(t, splits, true);
      const bool star = dispatched && t == chosen && splits == chosen_splits;
      print_row({"linear_s8_fused", shape, name(t, splits) + (star ? " *" : ""), ms, flops / ms / 1e9, "TOP/s",
                 fp16_ms / ms});
    }
  // The static form of the dispatch's choice (above kFusedMaxM: of the tile rule's, unsplit).
  const int64_t static_splits = dispatched ? chosen_splits : 1;
  if (!linear_s8_fused_supported(s.M, s.N, s.K, chosen, linear_s8_fused_max_smem(), nullptr, static_splits)) return;
  const double ms = time_tile(chosen, static_splits, false);
  print_row({"linear_s8_static", shape, name(chosen, static_splits) + " (int8 x)", ms, flops / ms / 1e9, "TOP/s",
             fp16_ms / ms});
}

// Rows of one weight-only GEMV bench: the fp16 GEMM, then each kernel, eager (bench) and replayed
// as a CUDA graph (bench + "_graph", ratios against fp16's graph replay). `call(kernel, i, stream)`
// runs kernel `kernel` on operand copy i; weight_bytes: the weight's bytes (codes + scales).
using GemvCall = std::function<void(size_t, int, cudaStream_t)>;
void gemv_rows(const char* bench, const Shape& s, const std::vector<std::string>& impls, int copies,
               double weight_bytes, int reps, Timer& timer, cublasLtHandle_t lt, const GemvCall& call) {
  const std::string shape = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
  const double flops = 2.0 * static_cast<double>(s.M) * s.N * s.K;
  double fp16_graph = 0;
  const double fp16_ms = float_gemm_ms(s, CUDA_R_16F, reps, timer, lt, &fp16_graph);
  const std::string graph_bench = std::string(bench) + "_graph";
  print_row({bench, shape, "cublasLt fp16", fp16_ms, flops / fp16_ms / 1e9, "TFLOP/s", 1.0});
  print_row({graph_bench, shape, "cublasLt fp16", fp16_graph, flops / fp16_graph / 1e9, "TFLOP/s", 1.0});
  for (size_t k = 0; k < impls.size(); ++k) {
    const auto [ms, graph] =
        timer.eager_and_graph_ms(reps, copies, [&](int i, cudaStream_t stream) { call(k, i, stream); });
    print_row({bench, shape, impls[k], ms, weight_bytes / ms / 1e6, "GB/s w", fp16_ms / ms});
    print_row({graph_bench, shape, impls[k], graph, weight_bytes / graph / 1e6, "GB/s w", fp16_graph / graph});
  }
}

// The int4 weight-only GEMVs (group 128, signed codes, float x and y) beside the fp16 GEMM.
void bench_s4_gemv(const Shape& s, int reps, Timer& timer, cublasLtHandle_t lt) {
  constexpr int64_t kGroup = 128;
  const int64_t G = (s.K + kGroup - 1) / kGroup;
  const size_t set = static_cast<size_t>(s.N * s.K / 2 + s.N * G * 4 + s.M * s.K * 4);
  const int R = copies_for(set);
  DeviceBuffer<uint8_t> P(s.N * s.K / 2 * R);
  DeviceBuffer<float> S(s.N * G * R), X(s.M * s.K * R), Y(s.M * s.N), B(s.N);
  fill_random<uint8_t>(P, 9, [](std::mt19937& r) { return static_cast<uint8_t>(r()); });
  fill_random<float>(S, 10, [](std::mt19937& r) { return 0.001f + 0.01f * std::uniform_real_distribution<float>()(r); });
  fill_random<float>(X, 11, rand_f);
  fill_random<float>(B, 12, rand_f);
  // GB/s of the weight (codes + scales) alone: what bounds a decode step.
  const double weight_bytes = static_cast<double>(s.N) * s.K / 2 + static_cast<double>(s.N) * G * 4;
  DeviceBuffer<uint8_t> work(gemv_f32s4_mma_staged_workspace_bytes(s.M, s.K));
  // The same codes in the tiled layout frozen layers keep on the GPU (repack_s4_tiles_cuda).
  const int64_t tiled_bytes = s4_tiled_bytes(s.N, s.K);
  DeviceBuffer<uint8_t> T(tiled_bytes * R);
  for (int i = 0; i < R; ++i)
    repack_s4_tiles_cuda(P.get() + i * s.N * s.K / 2, s.N, s.K, T.get() + i * tiled_bytes, nullptr);
  check_cuda(cudaDeviceSynchronize(), "repack_s4_tiles_cuda");
  gemv_rows("gemv_s4_g128", s,
            {"qforge int4 (gemv_f32s4_mma_cuda)", "qforge int4 (gemv_f32s4_mma_staged_cuda)",
             "qforge int4 (gemv_f32s4_cuda)", "qforge int4 (mma, tiles)", "qforge int4 (mma_staged, tiles)"},
            R, weight_bytes, reps, timer, lt, [&](size_t kernel, int i, cudaStream_t stream) {
              const float* x = X.get() + i * s.M * s.K;
              const uint8_t* p = P.get() + i * s.N * s.K / 2;
              const uint8_t* t = T.get() + i * tiled_bytes;
              const float* sc = S.get() + i * s.N * G;
              if (kernel == 0) {
                gemv_f32s4_mma_cuda(x, s.M, p, s.N, s.K, true, sc, nullptr, kGroup, B.get(), Y.get(), stream);
              } else if (kernel == 1) {
                gemv_f32s4_mma_staged_cuda(x, s.M, p, s.N, s.K, true, sc, nullptr, kGroup, B.get(), Y.get(),
                                           work.get(), stream);
              } else if (kernel == 3) {
                gemv_f32s4_mma_cuda(x, s.M, t, s.N, s.K, true, sc, nullptr, kGroup, B.get(), Y.get(), stream, true);
              } else if (kernel == 4) {
                gemv_f32s4_mma_staged_cuda(x, s.M, t, s.N, s.K, true, sc, nullptr, kGroup, B.get(), Y.get(),
                                           work.get(), stream, true);
              } else {
                gemv_f32s4_cuda(x, s.M, p, s.N, s.K, true, sc, nullptr, kGroup, B.get(), Y.get(), stream);
              }
            });
}

// The int8 weight-only GEMV (one scale per row, float x and y) beside the fp16 GEMM.
void bench_s8_gemv(const Shape& s, int reps, Timer& timer, cublasLtHandle_t lt) {
  const size_t set = static_cast<size_t>(s.N * s.K + s.N * 4 + s.M * s.K * 4);
  const int R = copies_for(set);
  DeviceBuffer<int8_t> Q(s.N * s.K * R);
  DeviceBuffer<float> S(s.N * R), X(s.M * s.K * R), Y(s.M * s.N), B(s.N);
  fill_random<int8_t>(Q, 13, rand_s8);
  fill_random<float>(S, 14, [](std::mt19937& r) { return 0.001f + 0.01f * std::uniform_real_distribution<float>()(r); });
  fill_random<float>(X, 15, rand_f);
  fill_random<float>(B, 16, rand_f);
  const double weight_bytes = static_cast<double>(s.N) * s.K + static_cast<double>(s.N) * 4;
  gemv_rows("gemv_s8", s, {"qforge int8 (gemv_f32s8_cuda)"}, R, weight_bytes, reps, timer, lt,
            [&](size_t, int i, cudaStream_t stream) {
              gemv_f32s8_cuda(X.get() + i * s.M * s.K, s.M, Q.get() + i * s.N * s.K, s.N, s.K, S.get() + i * s.N,
                              B.get(), Y.get(), stream);
            });
}

void bench_fake_quant(int64_t n, int reps, Timer& timer) {
  const std::string shape = std::to_string(n >> 20) + "Mi floats";
  DeviceBuffer<float> x(n), y(n);
  DeviceBuffer<bool> mask(n);
  fill_random<float>(x, 7, rand_f);
  const double copy_ms = timer.median_ms(reps, 1, [&](int) {
    check_cuda(cudaMemcpyAsync(y.get(), x.get(), x.bytes(), cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
  });
  const double copy_bytes = 2.0 * static_cast<double>(x.bytes());
  const double copy_gbs = copy_bytes / copy_ms / 1e6;
  print_row({"memcpy_d2d", shape, "cudaMemcpyAsync", copy_ms, copy_gbs, "GB/s", 0});
  const qforge::fq::AffineGrid g = qforge::fq::make_grid(0.0173f, 0.0f, -128.0f, 127.0f);
  auto row = [&](const char* bench, const char* impl, double bytes, const std::function<void()>& fn) {
    const double ms = timer.median_ms(reps, 1, [&](int) { fn(); });
    const double gbs = bytes / ms / 1e6;
    print_row({bench, shape, impl, ms, gbs, "GB/s", gbs / copy_gbs});
  };
  const double f = static_cast<double>(n) * sizeof(float);
  row("fq_per_tensor", "forward (x -> y)", 2 * f, [&] {
    check_cuda(fake_quantize_per_tensor(x.get(), y.get(), nullptr, n, g, nullptr), "fq");
  });
  row("fq_per_tensor", "forward + STE mask", 2 * f + n, [&] {
    check_cuda(fake_quantize_per_tensor(x.get(), y.get(), mask.get(), n, g, nullptr), "fq");
  });
  const int64_t C = 4096;
  DeviceBuffer<float> scale(C), zp(C);
  fill_random<float>(scale, 8, [](std::mt19937& r) { return 0.001f + 0.05f * std::uniform_real_distribution<float>()(r); });
  check_cuda(cudaMemset(zp.get(), 0, zp.bytes()), "cudaMemset");
  row("fq_per_channel", "forward + STE mask (C=4096)", 2 * f + n, [&] {
    check_cuda(fake_quantize_per_channel(x.get(), y.get(), mask.get(), n, C, n / C, scale.get(), zp.get(), -128.0f,
                                         127.0f, nullptr),
               "fq");
  });
  row("fq_float8_e4m3", "forward + STE mask", 2 * f + n, [&] {
    check_cuda(fake_quantize_float8(x.get(), y.get(), mask.get(), n, 1, n, scale.get(), qforge::fq::kE4M3, nullptr),
               "fq");
  });
  row("fq_backward", "dx = mask ? dy : 0", 2 * f + n, [&] {
    check_cuda(fake_quantize_backward(x.get(), mask.get(), y.get(), n, nullptr), "fq");
  });
  // LSQ's backward per channel (x, dy in; dx out; two double sums per channel and chunk).
  std::vector<qforge::fq::LsqGrid> grids(C, qforge::fq::LsqGrid{0.02f, 50.0f, 0.0f, -128.0f, 127.0f, 1e-3f});
  DeviceBuffer<qforge::fq::LsqGrid> dgrids(C);
  check_cuda(cudaMemcpy(dgrids.get(), grids.data(), dgrids.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
  DeviceBuffer<float> dx(n), ds(C), dz(C);
  DeviceBuffer<double> work(lsq_backward_workspace_doubles(C, n / C));
  row("lsq_backward", "dx, dscale, dzero_point (C=4096)", 3 * f, [&] {
    check_cuda(lsq_backward_rows(x.get(), y.get(), dx.get(), C, n / C, dgrids.get(), ds.get(), dz.get(), work.get(),
                                 nullptr),
               "lsq");
  });
}

void write_json(const char* path, const cudaDeviceProp& p) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) throw qforge::Error(std::string("qbench_gpu: cannot write ") + path);
  std::fprintf(f, "{\"device\": \"%s\", \"sm\": \"%d.%d\", \"multiprocessors\": %d, \"l2_bytes\": %d, \"rows\": [\n",
               p.name, p.major, p.minor, p.multiProcessorCount, p.l2CacheSize);
  for (size_t i = 0; i < g_rows.size(); ++i) {
    const Row& r = g_rows[i];
    std::fprintf(f, "  {\"bench\": \"%s\", \"shape\": \"%s\", \"impl\": \"%s\", \"ms\": %.6f, \"rate\": %.3f, "
                    "\"unit\": \"%s\", \"vs_baseline\": %.4f}%s\n",
                 r.bench.c_str(), r.shape.c_str(), r.impl.c_str(), r.ms, r.rate, r.unit.c_str(), r.vs,
                 i + 1 < g_rows.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  if (std::fclose(f) != 0) throw qforge::Error(std::string("qbench_gpu: cannot write ") + path);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* json = nullptr;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
      filter = argv[++i];
    } else {
      std::fprintf(stderr, "usage: qbench_gpu [--quick] [--json FILE] [--filter SECTION]\n"
                           "  sections: fake_quant, gemm (int8 GEMM, chain, fused Linear), gemv_s4, gemv_s8,\n"
                           "  gemm_fallback; --filter runs those whose name contains SECTION\n");
      return 2;
    }
  }
  const auto runs = [&](const char* section) { return std::string(section).find(filter) != std::string::npos; };
  try {
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    cudaDeviceProp p{};
    check_cuda(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    std::printf("qbench_gpu on %s (sm_%d%d, %d SMs, L2 %d MB); operands rotate through %zu MiB per timed call set\n",
                p.name, p.major, p.minor, p.multiProcessorCount, p.l2CacheSize >> 20, kRotateBytes >> 20);
    std::printf("%-18s %-22s %-30s %9s %9s %-7s %s\n", "bench", "shape MxNxK", "impl", "ms", "rate", "unit",
                "x fp16 / x memcpy");
    Timer timer;
    const int reps = quick ? 5 : 21;
    if (runs("fake_quant")) bench_fake_quant(quick ? (int64_t{1} << 24) : (int64_t{1} << 28), reps, timer);
    LtHandle lt;
    std::vector<Shape> shapes;
    for (const int64_t M : {int64_t{1}, int64_t{16}, int64_t{128}, int64_t{2048}}) {
      shapes.push_back({M, 768, 768, "BERT attention projections"});
      shapes.push_back({M, 3072, 768, "BERT FFN up"});
      shapes.push_back({M, 768, 3072, "BERT FFN down"});
    }
    shapes.push_back({4096, 4096, 4096, "square"});
    if (quick) shapes = {{16, 768, 768, ""}, {4096, 4096, 4096, ""}};
    if (!runs("gemm")) shapes.clear();
    for (const Shape& s : shapes)
      bench_linear_fused(s, reps, timer, bench_gemm(s, reps, timer, lt.get(), /*chain=*/s.M <= 2048 && s.N != 4096));
    std::vector<Shape> gemv;
    for (const int64_t M : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{16}}) {
      gemv.push_back({M, 4096, 4096, "square"});
      gemv.push_back({M, 14336, 4096, "Llama-3-8B FFN up / gate"});
      gemv.push_back({M, 4096, 14336, "Llama-3-8B FFN down"});
    }
    if (quick) gemv = {{1, 4096, 4096, ""}, {16, 14336, 4096, ""}};
    for (const Shape& s : gemv)
      if (runs("gemv_s4")) bench_s4_gemv(s, reps, timer, lt.get());
    for (const Shape& s : gemv)
      if (runs("gemv_s8")) bench_s8_gemv(s, reps, timer, lt.get());
    if (runs("gemm_fallback")) {
      // The fallback kernel at 4096^3: what a shape cuBLASLt refuses costs.
      const Shape s{4096, 4096, 4096, ""};
      DeviceBuffer<int8_t> A(s.M * s.K), W(s.N * s.K);
      DeviceBuffer<int32_t> C(s.M * s.N);
      fill_random<int8_t>(A, 2, rand_s8);
      fill_random<int8_t>(W, 3, rand_s8);
      GemmS8S8S32Cuda gemm;
      gemm.set_use_cublaslt(false);
      const double ms = timer.median_ms(quick ? 3 : 5, 1, [&](int) {
        gemm.run(A.get(), s.K, W.get(), s.K, C.get(), s.N, s.M, s.N, s.K, nullptr);
      });
      print_row({"gemm", "4096x4096x4096", "qforge int8 (gemm_s8s8s32_cuda)", ms, 2.0 * 4096 * 4096 * 4096 / ms / 1e9,
                 "TOP/s", 0});
    }
    if (json != nullptr) write_json(json, p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qbench_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
