#include <gtest/gtest.h>

#include <cstdlib>

#include "framework/core/error.h"
#include "kernels/cpu/isa.h"

using namespace qforge::kernels;

TEST(Isa, NamesRoundTrip) {
  for (Isa isa : {Isa::kReference, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni}) {
    EXPECT_EQ(isa_from_name(isa_name(isa)), isa);
  }
}

TEST(Isa, UnknownNameThrowsWithHint) {
  try {
    isa_from_name("avx512vnn");
    FAIL() << "expected qforge::Error";
  } catch (const qforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("avx512vnni"), std::string::npos) << e.what();
  }
}

TEST(Isa, CapMakesHigherLevelsUnusableAndRestores) {
  const Isa before = max_isa();
  {
    ScopedMaxIsa cap(Isa::kReference);
    std::string why;
    EXPECT_FALSE(isa_usable(Isa::kAvx2, &why));
    EXPECT_NE(why.find("capped"), std::string::npos) << why;
    EXPECT_TRUE(isa_usable(Isa::kReference));
  }
  EXPECT_EQ(max_isa(), before);
}

TEST(Isa, VnniKernelsAreCompiledInWhenTheCpuHasThem) {
  // The development and CI machines have AVX-512 VNNI; if not, the fallback tests still run.
  if (cpu_isa() != Isa::kAvx512Vnni) GTEST_SKIP() << "CPU level " << isa_name(cpu_isa());
  EXPECT_TRUE(isa_compiled(Isa::kAvx512Vnni));
  EXPECT_TRUE(isa_compiled(Isa::kAvx2));
}

TEST(Isa, EnvironmentCapIsTheInitialCap) {
  const char* env = std::getenv("QFORGE_MAX_ISA");
  if (env == nullptr || *env == '\0') GTEST_SKIP() << "QFORGE_MAX_ISA not set";
  EXPECT_EQ(max_isa(), isa_from_name(env));
}
