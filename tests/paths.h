// The checkout's and the build tree's paths the tests use (QFORGE_SOURCE_DIR, QTRAIN_BIN, ...), as
// const char* expressions read from one generated file of qforge_testing (tests/CMakeLists.txt)
// rather than -D flags: no other translation unit holds an absolute path, so the compiler cache
// serves a fresh clone of the tree wherever it lies.
#pragma once

namespace qforge::testing {

// The value the build configured for NAME (e.g. "QTRAIN_BIN"); aborts naming it when there is none.
const char* path(const char* name);

}  // namespace qforge::testing

#define QFORGE_SOURCE_DIR ::qforge::testing::path("QFORGE_SOURCE_DIR")
#define QFORGE_GOLDEN_DIR ::qforge::testing::path("QFORGE_GOLDEN_DIR")
#define QFORGE_FIXTURES_DIR ::qforge::testing::path("QFORGE_FIXTURES_DIR")
#define QFORGE_TEXT_FIXTURES ::qforge::testing::path("QFORGE_TEXT_FIXTURES")
#define QFORGE_LLAMA_FIXTURES ::qforge::testing::path("QFORGE_LLAMA_FIXTURES")
#define QFORGE_TORCHSCRIPT_FIXTURES ::qforge::testing::path("QFORGE_TORCHSCRIPT_FIXTURES")
#define QFORGE_IO_TEST_TOOL ::qforge::testing::path("QFORGE_IO_TEST_TOOL")
#define QTRAIN_BIN ::qforge::testing::path("QTRAIN_BIN")
#define QDUMP_BIN ::qforge::testing::path("QDUMP_BIN")
#define QGEN_BIN ::qforge::testing::path("QGEN_BIN")
#define QBENCH_BIN ::qforge::testing::path("QBENCH_BIN")
