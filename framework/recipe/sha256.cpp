// SHA-256 through Nettle (Debian's nettle-dev), the library GnuTLS builds on.
#include "framework/recipe/sha256.h"

#include <nettle/sha2.h>

#include <cstdint>
#include <cstdio>

namespace qforge {

std::string sha256_hex(const std::string& data) {
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, data.size(), reinterpret_cast<const uint8_t*>(data.data()));
  uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, SHA256_DIGEST_SIZE, digest);
  std::string hex(2 * SHA256_DIGEST_SIZE, '0');
  constexpr char kDigits[] = "0123456789abcdef";
  for (int i = 0; i < SHA256_DIGEST_SIZE; ++i) {
    hex[2 * i] = kDigits[digest[i] >> 4];
    hex[2 * i + 1] = kDigits[digest[i] & 0xf];
  }
  return hex;
}

}  // namespace qforge
