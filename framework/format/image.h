// Image files a user gives as data (PNG through libpng, JPEG through libjpeg), decoded to 8-bit
// pixels with the channels the caller asks for. The decoders stay inside image.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qforge::io {

// Decoded pixels, row-major [height][width][channels] (channels last), 0..255.
struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

// True when `path` starts with the PNG or JPEG signature (the decoder is chosen by content, not
// by the file name's extension).
bool is_image_file(const std::string& path);

// Decodes the PNG or JPEG file at `path` to `channels` channels as PIL converts it for torchvision's
// ImageFolder (Image.convert("RGB"), then convert("L") for 1 channel): 3 (RGB; a grey image
// repeated) or 1 (grey: PIL's integer luma (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16 of
// the 8-bit RGB values, or the grey samples as stored). PNG: palettes expanded, grey below 8 bits
// expanded, an alpha channel dropped (not composited), 16-bit colour samples truncated to their
// high byte, gamma chunks ignored (as PIL ignores them); 16-bit grey refused. JPEG: baseline and
// progressive, 8-bit, grey or YCbCr (CMYK refused), a file whose data ends early refused. Throws
// qforge::Error naming the file and the library's message when it is not such a file, is truncated
// or corrupt.
// With height and width > 0 an image of another size is refused from its header, before any pixel
// is decoded; either way, one of more than 2^26 pixels is. The libraries trust what they parse:
// call this on files from elsewhere inside io::h5::run_isolated (framework/format/hdf5.h), as the
// recipe's image folders do.
Image read_image(const std::string& path, int64_t channels, int64_t height = 0, int64_t width = 0);

}  // namespace qforge::io
