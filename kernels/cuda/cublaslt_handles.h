// RAII owners of the cuBLASLt handle and descriptors: created in the constructor (errors become
// qforge::Error with the status name), destroyed exactly once, move-only.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace qforge::cuda {

// One owner template: T is the opaque handle type, Destroy its cuBLASLt destroy function.
template <typename T, cublasStatus_t (*Destroy)(T)>
class LtOwner {
 public:
  LtOwner() = default;
  explicit LtOwner(T h) : h_(h) {}
  LtOwner(const LtOwner&) = delete;
  LtOwner& operator=(const LtOwner&) = delete;
  LtOwner(LtOwner&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  LtOwner& operator=(LtOwner&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  ~LtOwner() { reset(); }
  T get() const { return h_; }

 private:
  // A destroy failure cannot be reported from a destructor; the handle is gone either way.
  void reset() {
    if (h_ != nullptr) (void)Destroy(h_);
    h_ = nullptr;
  }
  T h_ = nullptr;
};

class LtHandle : public LtOwner<cublasLtHandle_t, cublasLtDestroy> {
 public:
  LtHandle() : LtOwner(create()) {}

 private:
  static cublasLtHandle_t create() {
    cublasLtHandle_t h = nullptr;
    check_cublas(cublasLtCreate(&h), "cublasLtCreate");
    return h;
  }
};

class LtMatmulDesc : public LtOwner<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> {
 public:
  LtMatmulDesc(cublasComputeType_t compute, cudaDataType_t scale) : LtOwner(create(compute, scale)) {}
  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& value) {
    check_cublas(cublasLtMatmulDescSetAttribute(get(), attr, &value, sizeof value),
                 "cublasLtMatmulDescSetAttribute");
  }

 private:
  static cublasLtMatmulDesc_t create(cublasComputeType_t compute, cudaDataType_t scale) {
    cublasLtMatmulDesc_t d = nullptr;
    check_cublas(cublasLtMatmulDescCreate(&d, compute, scale), "cublasLtMatmulDescCreate");
    return d;
  }
};

// Column-major layout (cuBLASLt's default order) of rows x cols elements, leading dimension ld.
class LtMatrixLayout : public LtOwner<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> {
 public:
  LtMatrixLayout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld)
      : LtOwner(create(type, rows, cols, ld)) {}

 private:
  static cublasLtMatrixLayout_t create(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t l = nullptr;
    check_cublas(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld), "cublasLtMatrixLayoutCreate");
    return l;
  }
};

class LtMatmulPreference
    : public LtOwner<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> {
 public:
  LtMatmulPreference() : LtOwner(create()) {}
  template <typename V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(get(), attr, &value, sizeof value),
                 "cublasLtMatmulPreferenceSetAttribute");
  }

 private:
  static cublasLtMatmulPreference_t create() {
    cublasLtMatmulPreference_t p = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&p), "cublasLtMatmulPreferenceCreate");
    return p;
  }
};

}  // namespace qforge::cuda
