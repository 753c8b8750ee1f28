// h5:: wrappers: every tensor dtype and shape round-trips bit for bit; attributes; clear errors.
#include "framework/format/hdf5.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "framework/core/error.h"
#include "tests/io/io_fixtures.h"
#include "tests/io/io_test_util.h"
#include "tests/paths.h"

namespace qforge::io {
namespace {

using testing::same_tensor;
using testing::TempDir;

TEST(Hdf5, TensorsOfEveryDtypeRoundTripBitForBit) {
  TempDir dir;
  const std::string path = dir.file("t.h5");
  std::map<std::string, at::Tensor> tensors = {
      {"f32", testing::pattern({3, 5})},
      {"f32_nan", at::tensor(std::vector<float>{1.0f, NAN, INFINITY, -INFINITY, -0.0f})},
      {"f64", testing::pattern({2, 2, 2}).to(at::kDouble).div(3)},
      {"f16", testing::pattern({7}).to(at::kHalf)},
      {"bf16", testing::pattern({4, 1}).to(at::kBFloat16)},
      {"bool", at::tensor({1, 0, 1}).to(at::kBool)},
      {"i8", testing::int_pattern({9}, -128, 127).to(at::kChar)},
      {"u8", testing::int_pattern({9}, 0, 255).to(at::kByte)},
      {"i16", testing::int_pattern({9}, -30000, 30000).to(at::kShort)},
      {"i32", testing::int_pattern({2, 9}, -100000, 100000)},
      {"i64", at::tensor({int64_t{1} << 40, -(int64_t{1} << 62), int64_t{0}})},
      {"scalar", at::scalar_tensor(2.5f)},
      {"empty", at::empty({0, 4})},
      {"strided", testing::pattern({6, 4}).t()},  // non-contiguous input
      {"multi_chunk", testing::pattern({1000, 600})},  // > 1 MiB: several chunks
  };
  {
    h5::File f = h5::File::create(path);
    const h5::Group g = f.root().create_group("data");
    for (const auto& [name, t] : tensors) g.write_tensor(name, t);
    f.close();
  }
  const h5::File f = h5::File::open(path);
  const h5::Group g = f.root().open_group("data");
  EXPECT_EQ(g.children().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor back = g.read_tensor(name);
    EXPECT_TRUE(same_tensor(back, t.contiguous())) << name << ": " << back.scalar_type() << " "
                                                   << back.sizes();
    const h5::DatasetInfo info = g.open_dataset(name).info();
    EXPECT_EQ(info.dtype, t.scalar_type()) << name;
    EXPECT_EQ(info.shape, t.sizes().vec()) << name;
  }
}

TEST(Hdf5, AttributesRoundTripAndReplace) {
  TempDir dir;
  const std::string path = dir.file("a.h5");
  {
    h5::File f = h5::File::create(path);
    const h5::Group r = f.root();
    r.set_attr("s", "hello\nworld ünïcode");
    r.set_attr("i", int64_t{-7});
    r.set_attr("d", 0.1);
    r.set_attr("v", std::vector<int64_t>{4, 0, 3});
    r.set_attr("empty", std::vector<int64_t>{});
    r.set_attr("i", int64_t{9});  // replaced
    f.close();
  }
  const h5::File f = h5::File::open(path);
  const h5::Group r = f.root();
  EXPECT_EQ(r.attr_string("s"), "hello\nworld ünïcode");
  EXPECT_EQ(r.attr_int("i"), 9);
  EXPECT_EQ(r.attr_double("d"), 0.1);
  EXPECT_EQ(r.attr_ints("v"), (std::vector<int64_t>{4, 0, 3}));
  EXPECT_TRUE(r.attr_ints("empty").empty());
  EXPECT_EQ(r.attr_names(), (std::vector<std::string>{"d", "empty", "i", "s", "v"}));
  EXPECT_EQ(r.attr_to_string("v"), "[4, 0, 3]");
}

TEST(Hdf5, ErrorsNameTheFileAndObjectPath) {
  TempDir dir;
  const std::string path = dir.file("e.h5");
  {
    h5::File f = h5::File::create(path);
    f.root().create_group("g").write_tensor("x", at::ones({2}));
    f.close();
  }
  const h5::File f = h5::File::open(path);
  const h5::Group g = f.root().open_group("g");
  try {
    g.read_tensor("y");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing dataset '/g/y'"), std::string::npos) << e.what();
  }
  try {
    g.open_dataset("x").attr_int("nope");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset '/g/x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing attribute 'nope'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.create_group("a/b"), Error);
  EXPECT_THROW(f.root().open_group("missing"), Error);
}

TEST(Hdf5, DeclaredSizesBeyondTheStoredBytesAreRefusedBeforeAllocating) {
  TempDir dir;
  const std::string path = dir.file("sparse.h5");
  ASSERT_EQ(std::system((std::string(QFORGE_IO_TEST_TOOL) + " make-sparse-dataset " + path).c_str()), 0);
  const h5::File f = h5::File::open(path);
  try {
    f.root().read_tensor("x");
    FAIL() << "a 1 GiB dataset stored in no bytes was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("declares shape [268435456] (1073741824 bytes) but the file stores 0 bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST(Hdf5, NullDataspaceDatasetsAreRefusedAsHavingNoData) {
  TempDir dir;
  const std::string path = dir.file("null.h5");
  ASSERT_EQ(std::system((std::string(QFORGE_IO_TEST_TOOL) + " make-null-dataset " + path).c_str()), 0);
  const h5::File f = h5::File::open(path);
  try {
    f.root().read_tensor("x");
    FAIL() << "a dataset with a null dataspace was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset '/x': has no stored data (never written, or created without data)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Hdf5, CloseClosesObjectsStillOpenAndTheirOwnersThenDoNothing) {
  TempDir dir;
  const std::string path = dir.file("open.h5");
  {
    h5::File f = h5::File::create(path);
    const h5::Group g = f.root().create_group("g");
    const h5::Dataset d = g.write_tensor("x", at::arange(6, at::kFloat));
    d.set_attr("n", int64_t{6});
    f.close();
    EXPECT_FALSE(f.is_open());
  }  // d and g go out of scope holding identifiers that File::close already closed
  const h5::File f = h5::File::open(path);
  const h5::Dataset d = f.root().open_group("g").open_dataset("x");
  EXPECT_TRUE(same_tensor(d.read(), at::arange(6, at::kFloat)));
  EXPECT_EQ(d.attr_int("n"), 6);
}

TEST(Hdf5, OpeningMissingOrNonHdf5FilesThrowsClearly) {
  TempDir dir;
  EXPECT_THROW(h5::File::open(dir.file("nope.h5")), Error);
  testing::write_bytes(dir.file("text.h5"), {'h', 'e', 'l', 'l', 'o'});
  try {
    h5::File::open(dir.file("text.h5"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an HDF5 file"), std::string::npos) << e.what();
  }
}

TEST(Hdf5, VisitWalksTheTreeInNameOrder) {
  TempDir dir;
  const std::string path = dir.file("v.h5");
  {
    h5::File f = h5::File::create(path);
    const h5::Group b = f.root().create_group("b");
    b.write_tensor("z", at::ones({1}));
    b.create_group("a").write_tensor("x", at::ones({1}));
    f.root().write_tensor("a", at::ones({1}));
    f.close();
  }
  std::vector<std::string> seen;
  h5::File::open(path).root().visit([&](const std::string& p, h5::ObjectType t, int depth) {
    seen.push_back(p + (t == h5::ObjectType::kGroup ? "/" : "") + std::to_string(depth));
  });
  EXPECT_EQ(seen, (std::vector<std::string>{"a0", "b/0", "b/a/1", "b/a/x2", "b/z1"}));
}

}  // namespace
}  // namespace qforge::io
