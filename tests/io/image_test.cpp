// io::read_image (framework/format/image.h) against what PIL makes of the same files as
// torchvision's ImageFolder loads them (scripts/torchscript/make_fixtures.py wrote the images and
// colour_images_expected.safetensors with PIL 9.4 on Debian's libjpeg-turbo and libpng; a gAMA
// chunk PIL ignores included), and its refusals: another size, truncated files (in the header and
// in the scan data), 16-bit grey, files of neither format, a header claiming too many pixels.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/format/image.h"
#include "framework/format/safetensors.h"
#include "tests/paths.h"

namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name) {
  return std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/torchscript/" + name;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const qforge::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A scratch file under the temporary directory holding `bytes`.
std::string scratch(const std::string& name, const std::vector<char>& bytes) {
  const fs::path p = fs::temp_directory_path() / ("qforge_image_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p.string();
}

std::vector<char> bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void put_u32(std::vector<char>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((v >> s) & 0xff));
}

// A PNG chunk: length, type, data, CRC-32 of type and data.
void put_chunk(std::vector<char>& b, const char* type, const std::vector<char>& data) {
  put_u32(b, static_cast<uint32_t>(data.size()));
  std::vector<char> td(type, type + 4);
  td.insert(td.end(), data.begin(), data.end());
  b.insert(b.end(), td.begin(), td.end());
  put_u32(b, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(td.data()), static_cast<uInt>(td.size()))));
}

}  // namespace

TEST(Image, DecodesAsPilConvertsForImageFolder) {
  const auto expected = qforge::io::read_safetensors(fixture("colour_images_expected.safetensors"));
  for (const char* name : {"rgb.jpg", "rgba.png", "palette.png", "grey.jpg", "gamma.png"}) {
    for (const int64_t channels : {3, 1}) {
      const at::Tensor want = expected.tensors.at(std::string(name) + (channels == 3 ? ".rgb" : ".l"));
      const qforge::io::Image img = qforge::io::read_image(fixture("colour_images/") + name, channels);
      ASSERT_EQ(img.height, want.size(0)) << name;
      ASSERT_EQ(img.width, want.size(1)) << name;
      ASSERT_EQ(img.channels, channels) << name;
      const at::Tensor got = at::from_blob(const_cast<uint8_t*>(img.pixels.data()),
                                           {img.height, img.width, channels}, at::kByte);
      EXPECT_TRUE(at::equal(got, want)) << name << ", " << channels << " channels: "
                                        << (got.to(at::kInt) - want.to(at::kInt)).abs().max().item<int>()
                                        << " at most apart";
    }
  }
}

TEST(Image, RefusesAnotherSizeTruncatedAndForeignFilesAndHugeHeaders) {
  EXPECT_NE(message_of([] { qforge::io::read_image(fixture("colour_images/rgb.jpg"), 3, 28, 28); })
                .find("is 20 x 24 (height x width), the model takes 28 x 28; resize the images first"),
            std::string::npos);
  EXPECT_NE(message_of([] { qforge::io::read_image(fixture("colour_images/rgba.png"), 1, 20, 20); })
                .find("is 20 x 24"),
            std::string::npos);
  for (const char* name : {"rgb.jpg", "rgba.png"}) {
    std::vector<char> b = bytes_of(fixture(std::string("colour_images/") + name));
    b.resize(b.size() / 2);
    const std::string half = scratch(std::string("half_") + name, b);
    const std::string m = message_of([&] { qforge::io::read_image(half, 3); });
    EXPECT_TRUE(m.find("corrupt or truncated PNG") != std::string::npos ||
                m.find("not a readable JPEG file") != std::string::npos)
        << name << ": " << m;
    EXPECT_NE(m.find(half), std::string::npos) << m;
    fs::remove(half);
  }
  // Cut inside the entropy-coded data (after the start-of-scan marker): libjpeg would pad the rest
  // with grey and report success; refused, as PIL refuses it.
  {
    std::vector<char> b = bytes_of(fixture("colour_images/rgb.jpg"));
    size_t sos = 0;
    for (size_t i = 0; i + 1 < b.size(); ++i)
      if (static_cast<unsigned char>(b[i]) == 0xff && static_cast<unsigned char>(b[i + 1]) == 0xda) sos = i;
    ASSERT_GT(sos, 0u);
    b.resize(sos + (b.size() - sos) / 2);
    const std::string cut = scratch("cut_scan.jpg", b);
    EXPECT_NE(message_of([&] { qforge::io::read_image(cut, 3); }).find("a truncated JPEG file"), std::string::npos)
        << message_of([&] { qforge::io::read_image(cut, 3); });
    fs::remove(cut);
  }
  EXPECT_NE(message_of([] { qforge::io::read_image(fixture("colour_images/grey16.png"), 1); })
                .find("a PNG file of 16-bit grey samples"),
            std::string::npos);
  const std::string text = scratch("text.png", {'h', 'e', 'l', 'l', 'o', '\n'});
  EXPECT_FALSE(qforge::io::is_image_file(text));
  EXPECT_NE(message_of([&] { qforge::io::read_image(text, 1); }).find("neither a PNG nor a JPEG file"), std::string::npos);
  fs::remove(text);

  // A valid PNG header claiming 65535 x 65535 grey pixels: refused from the header, nothing allocated.
  std::vector<char> png = {'\x89', 'P', 'N', 'G', '\r', '\n', '\x1a', '\n'};
  std::vector<char> ihdr;
  put_u32(ihdr, 65535);
  put_u32(ihdr, 65535);
  for (char c : {8, 0, 0, 0, 0}) ihdr.push_back(c);  // 8-bit grey, no interlace
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", {'\x78', '\x9c'});  // libpng reads the header up to the first IDAT
  put_chunk(png, "IEND", {});
  const std::string huge = scratch("huge.png", png);
  EXPECT_TRUE(qforge::io::is_image_file(huge));
  EXPECT_NE(message_of([&] { qforge::io::read_image(huge, 1); }).find("more than 67108864 pixels"), std::string::npos)
      << message_of([&] { qforge::io::read_image(huge, 1); });
  EXPECT_NE(message_of([&] { qforge::io::read_image(huge, 1, 28, 28); }).find("is 65535 x 65535"), std::string::npos);
  fs::remove(huge);
  EXPECT_NE(message_of([] { qforge::io::read_image(fixture("colour_images/rgb.jpg"), 2); }).find("channels must be 1 or 3"),
            std::string::npos);
}
