// oneDNN matmul wrapper for the large-M int8 GEMM. Every oneDNN object is held by its C++ API
// class (RAII); no create/destroy pairs by hand.
#include "kernels/cpu/gemm_s8s8s32_onednn.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <vector>

#include "framework/core/error.h"

namespace qforge::kernels::detail {

using dnnl::memory;

class OneDnnS8Weights {
 public:
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
  memory weights;  // packed, in pd.weights_desc()
  int64_t n = 0, k = 0;
};

namespace {

dnnl::matmul::primitive_desc make_pd(const dnnl::engine& engine, int64_t N, int64_t K) {
  const memory::desc src({DNNL_RUNTIME_DIM_VAL, K}, memory::data_type::s8, memory::format_tag::ab);
  const memory::desc wei({K, N}, memory::data_type::s8, memory::format_tag::any);
  const memory::desc dst({DNNL_RUNTIME_DIM_VAL, N}, memory::data_type::s32, memory::format_tag::ab);
  dnnl::primitive_attr attr;
  // User scratchpad: each run() brings its own, so concurrent runs of one primitive are safe.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(engine, src, wei, dst, attr);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, engine);
#endif
}

}  // namespace

std::shared_ptr<const OneDnnS8Weights> onednn_pack_s8(const int8_t* W, int64_t N, int64_t K,
                                                     std::string* status) {
  auto w = std::make_shared<OneDnnS8Weights>();
  try {
    w->pd = make_pd(w->engine, N, K);
    w->matmul = dnnl::matmul(w->pd);
    w->weights = memory(w->pd.weights_desc(), w->engine);
    // W is [N, K] row-major, i.e. the K x N matrix oneDNN wants in format "ba".
    memory user({{K, N}, memory::data_type::s8, memory::format_tag::ba}, w->engine,
                const_cast<int8_t*>(W));
    dnnl::stream stream(w->engine);
    dnnl::reorder(user, w->weights).execute(stream, user, w->weights);
    stream.wait();
  } catch (const dnnl::error& e) {
    if (status != nullptr) *status = std::string("oneDNN matmul unavailable: ") + e.what();
    return nullptr;
  }
  w->n = N;
  w->k = K;
  if (status != nullptr) status->clear();
  return w;
}

void onednn_gemm_s8s8s32(const OneDnnS8Weights& w, const int8_t* A, int64_t M, int32_t* C) {
  QF_CHECK(M > 0 && A != nullptr && C != nullptr);
  dnnl::stream stream(w.engine);
  memory src({{M, w.k}, memory::data_type::s8, memory::format_tag::ab}, w.engine,
             const_cast<int8_t*>(A));
  memory dst({{M, w.n}, memory::data_type::s32, memory::format_tag::ab}, w.engine, C);
  const memory::desc scratch_md = w.pd.scratchpad_desc();
  std::vector<uint8_t> scratch_bytes(scratch_md.get_size());
  memory scratch(scratch_md, w.engine, scratch_bytes.data());
  w.matmul.execute(stream, {{DNNL_ARG_SRC, src},
                            {DNNL_ARG_WEIGHTS, w.weights},
                            {DNNL_ARG_DST, dst},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
  stream.wait();
}

int64_t onednn_bytes(const OneDnnS8Weights& w) {
  return static_cast<int64_t>(w.pd.weights_desc().get_size());
}

std::string onednn_impl(const OneDnnS8Weights& w) { return w.pd.impl_info_str(); }

}  // namespace qforge::kernels::detail
