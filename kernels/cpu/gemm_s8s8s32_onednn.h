// Large-M int8 GEMM through oneDNN's matmul: C[M, N] = A[M, K] . W^T, s8 x s8 -> exact s32.
// The weights are reordered once into the blocked format oneDNN prefers (format_tag::any); the
// primitive is created per distinct M (cached) with that fixed weight format. The dequantizing
// epilogue stays qforge's, so results equal the reference bit for bit (on VNNI / AMX hardware,
// where oneDNN does not saturate).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cpu/conv_s8.h"

namespace qforge::kernels::detail {

class OneDnnS8Weights;  // oneDNN engine, primitive and packed weight memory (RAII, .cpp)

// Packs W int8 [N, K]; returns nullptr and sets *status when oneDNN cannot (then status says
// why); on success *status is empty.
std::shared_ptr<const OneDnnS8Weights> onednn_pack_s8(const int8_t* W, int64_t N, int64_t K,
                                                     std::string* status);

// A dense int8 [M, K], C dense int32 [M, N]. Thread-safe (user-managed scratchpad per call).
void onednn_gemm_s8s8s32(const OneDnnS8Weights& w, const int8_t* A, int64_t M, int32_t* C);

// Bytes of the packed weight memory held by oneDNN.
int64_t onednn_bytes(const OneDnnS8Weights& w);

// oneDNN's implementation name for the primitive (e.g. "brg:avx512_core_amx_int8").
std::string onednn_impl(const OneDnnS8Weights& w);

// oneDNN's int8 convolution (zero padding, any groups) over int8 channels-last codes: weights W
// int8 [N, C / groups, kh, kw] reordered once into the format oneDNN prefers for the `nominal` geometry;
// primitives are created per input size (batch, H, W; cached) with that fixed weight format.
// Output: exact int32 channels-last [B, OH, OW, N], the sums conv2d_s8_reference takes before its
// epilogue (w_zero 0). onednn_conv_s8 returns nullptr and sets *status when oneDNN cannot.
class OneDnnConvS8;
std::shared_ptr<const OneDnnConvS8> onednn_conv_s8(const int8_t* W, const ConvGeometry& nominal, std::string* status);
// g: the packed filter's geometry with any batch / input size. Returns false (nothing written,
// *why says so) when oneDNN has no primitive for that input size with the packed weights, or
// only its reference implementation (orders of magnitude slower than im2col + GEMM).
// Thread-safe (user-managed scratchpad per call).
bool onednn_conv_s8s8s32(const OneDnnConvS8& conv, const ConvGeometry& g, const int8_t* x_nhwc, int32_t* y_nhwc,
                         std::string* why = nullptr);
// The primitive onednn_conv_s8s8s32 would run for input size g (created and cached here), or
// nullptr with *why as onednn_conv_s8s8s32 gives it; a caller checking several sizes before
// running any holds them (the cache may be cleared by another thread in between).
struct OneDnnConvPrimitive;
std::shared_ptr<const OneDnnConvPrimitive> onednn_conv_primitive(const OneDnnConvS8& conv, const ConvGeometry& g,
                                                                 std::string* why = nullptr);
// Runs p (thread-safe): x_nhwc and y_nhwc of p's input size.
void onednn_conv_run(const OneDnnConvS8& conv, const OneDnnConvPrimitive& p, const int8_t* x_nhwc, int32_t* y_nhwc);
std::string onednn_impl(const OneDnnConvS8& conv);  // for the nominal geometry, e.g. "brgconv:avx512_core_vnni"
// The implementation oneDNN offers for input size g with the packed weight format ("ref_int8:any":
// only its reference, which onednn_conv_s8s8s32 refuses), or "" when it offers none.
std::string onednn_impl_for(const OneDnnConvS8& conv, const ConvGeometry& g);
int64_t onednn_bytes(const OneDnnConvS8& conv);     // bytes of the reordered weights

}  // namespace qforge::kernels::detail
