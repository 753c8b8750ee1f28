// The plotting library report.html inlines: Vega 6.2.0, Vega-Lite 6.4.1 and vega-embed 7.1.0
// (BSD-3-Clause; framework/report/vendor/, with licences and hashes), compiled into the binary so
// every page is self-contained and qtrain reads no files at run time.
#pragma once

#include <string_view>

namespace qforge::report_assets {

std::string_view vega_js();
std::string_view vega_lite_js();
std::string_view vega_embed_js();
// "vega 6.2.0, vega-lite 6.4.1, vega-embed 7.1.0"
const char* versions();

}  // namespace qforge::report_assets
