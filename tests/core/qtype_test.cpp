#include <gtest/gtest.h>

#include "framework/core/error.h"
#include "framework/core/qtype.h"

using namespace qforge;

TEST(QType, RangesMatchBits) {
  EXPECT_EQ(qint8.quant_min, -128);
  EXPECT_EQ(qint8.quant_max, 127);
  EXPECT_EQ(quint8.levels(), 256);
  EXPECT_EQ(qint4.levels(), 16);
  EXPECT_EQ(quint4.quant_max, 15);
  EXPECT_EQ(qint2.quant_min, -2);
  EXPECT_EQ(qint2.quant_max, 1);
  for (const QType& q : all_qtypes()) {
    if (q.is_integer()) {
      EXPECT_EQ(q.levels(), int64_t{1} << q.bits) << q.name;
    }
  }
  EXPECT_EQ(qfloat8_e4m3fn.max_finite, 448.0);
  EXPECT_EQ(qfloat8_e5m2.max_finite, 57344.0);
}

TEST(QType, LookupByNameAndAlias) {
  EXPECT_EQ(qtype_from_name("qint4"), qint4);
  EXPECT_EQ(qtype_from_name("int8"), qint8);
  EXPECT_EQ(qtype_from_name("fp8_e5m2"), qfloat8_e5m2);
  EXPECT_NE(qtype_from_name("quint8"), qint8);
}

TEST(QType, UnknownNameSuggestsClosest) {
  try {
    qtype_from_name("qint9");
    FAIL() << "expected qforge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'qint8'"), std::string::npos) << e.what();
  }
}

TEST(QType, Mxfp4AndNvfp4ByNameWithTheFormatsBlocks) {
  EXPECT_EQ(qtype_from_name("mxfp4"), qmxfp4);
  EXPECT_EQ(qtype_from_name("nvfp4"), qnvfp4);
  EXPECT_NE(qmxfp4, qnvfp4);
  EXPECT_TRUE(qmxfp4.is_microscaling() && qnvfp4.is_microscaling());
  EXPECT_FALSE(qmxfp4.is_float() || qmxfp4.is_integer() || qmxfp4.is_codebook());
  EXPECT_EQ(qmxfp4.block_size, 32);
  EXPECT_EQ(qnvfp4.block_size, 16);
  EXPECT_EQ(qmxfp4.max_finite, 6.0);
  try {
    qtype_from_name("mxfp5");
    FAIL() << "expected qforge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'mxfp4'"), std::string::npos) << e.what();
  }
}
