// The vendored Vega builds as read-only data of the binary (the assembler's .incbin; the build
// passes QFORGE_REPORT_VENDOR_DIR and rebuilds this file when a vendored file changes).
#include "framework/report/report_assets.h"

#ifndef QFORGE_REPORT_VENDOR_DIR
#error "QFORGE_REPORT_VENDOR_DIR must name framework/report/vendor"
#endif

#define QFORGE_INCBIN(sym, file)                                                 \
  asm(".section .rodata\n"                                                       \
      ".balign 16\n"                                                             \
      ".global " #sym "_begin\n" #sym "_begin:\n"                                \
      ".incbin \"" QFORGE_REPORT_VENDOR_DIR "/" file "\"\n"                      \
      ".global " #sym "_end\n" #sym "_end:\n"                                    \
      ".byte 0\n"                                                                \
      ".previous\n")

QFORGE_INCBIN(qforge_vega_js, "vega-6.2.0.min.js");
QFORGE_INCBIN(qforge_vega_lite_js, "vega-lite-6.4.1.min.js");
QFORGE_INCBIN(qforge_vega_embed_js, "vega-embed-7.1.0.min.js");

extern "C" {
extern const char qforge_vega_js_begin[], qforge_vega_js_end[];
extern const char qforge_vega_lite_js_begin[], qforge_vega_lite_js_end[];
extern const char qforge_vega_embed_js_begin[], qforge_vega_embed_js_end[];
}

namespace qforge::report_assets {

std::string_view vega_js() { return {qforge_vega_js_begin, static_cast<size_t>(qforge_vega_js_end - qforge_vega_js_begin)}; }
std::string_view vega_lite_js() {
  return {qforge_vega_lite_js_begin, static_cast<size_t>(qforge_vega_lite_js_end - qforge_vega_lite_js_begin)};
}
std::string_view vega_embed_js() {
  return {qforge_vega_embed_js_begin, static_cast<size_t>(qforge_vega_embed_js_end - qforge_vega_embed_js_begin)};
}
const char* versions() { return "vega 6.2.0, vega-lite 6.4.1, vega-embed 7.1.0"; }

}  // namespace qforge::report_assets
