// SHA-256 (FIPS 180-4) of a string, as 64 lowercase hex digits; used to fingerprint resolved recipes.
#pragma once

#include <string>

namespace qforge {

std::string sha256_hex(const std::string& data);

}  // namespace qforge
