// The byte-level alphabet of GPT-2 style BPE: every byte 0..255 stands for one printable code
// point (the printable Latin-1 bytes for themselves, the others for U+0100 onwards, in GPT-2's
// order), so a BPE over these characters sees every possible byte and never needs an unknown token.
#pragma once

#include <array>
#include <string>

namespace qforge::text {

// The code point byte `b` stands for (GPT-2's bytes_to_unicode()).
char32_t byte_to_unicode(unsigned char b);

// The 256 characters of the alphabet as UTF-8 strings, indexed by byte.
const std::array<std::string, 256>& byte_level_alphabet();

// Each byte of `bytes` replaced by its character (UTF-8 encoded).
std::string byte_level_encode(const std::string& bytes);

// The bytes a token's characters stand for; a token with a character outside the alphabet (an
// added token such as "<|im start|>") stands for its own UTF-8 bytes, as HF's ByteLevel decoder does.
std::string byte_level_decode_token(const std::string& token);

}  // namespace qforge::text
