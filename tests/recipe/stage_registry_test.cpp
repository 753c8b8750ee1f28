// The pipeline's stage registry: one ordered list that --stages, the dry run and the run read;
// whether a stage applies is decided by the stage from the recipe alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "framework/pipeline/pipeline.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/recipe/recipe.h"
#include "tests/paths.h"

using namespace qforge;

namespace {

std::vector<std::string> applying(const Recipe& r) {
  std::vector<std::string> out;
  for (const pipeline::Stage* s : pipeline::stages())
    if (s->applies(r)) out.emplace_back(s->name());
  return out;
}

Recipe shipped(const std::string& name, const std::vector<std::string>& overrides = {}) {
  return load_recipe(std::string(QFORGE_SOURCE_DIR) + "/recipes/" + name, overrides);
}

}  // namespace

TEST(StageRegistry, ListsEveryStageInRunOrder) {
  const std::vector<std::string> all{"data", "float", "search", "calibrate", "solve", "ptq", "qat", "layer_errors",
                                     "freeze", "export"};
  EXPECT_EQ(pipeline_stages(), all);
  for (const std::string& name : all) {
    ASSERT_NE(pipeline::find_stage(name), nullptr) << name;
    EXPECT_EQ(pipeline::find_stage(name)->name(), name);
  }
  EXPECT_EQ(pipeline::find_stage("bake"), nullptr);
}

TEST(StageRegistry, StagesOptionNamesAllButDataAndLayerErrors) {
  const std::vector<std::string> selectable{"float", "search", "calibrate", "solve", "ptq", "qat", "freeze", "export"};
  EXPECT_EQ(selectable_stages(), selectable);
}

TEST(StageRegistry, EachStageDecidesFromTheRecipeWhetherItApplies) {
  EXPECT_EQ(applying(shipped("bert_int8.yaml")),
            (std::vector<std::string>{"data", "float", "calibrate", "ptq", "qat", "layer_errors", "freeze", "export"}));
  EXPECT_EQ(applying(shipped("bert_int8.yaml", {"qat.epochs=0", "freeze.enabled=false"})),
            (std::vector<std::string>{"data", "float", "calibrate", "ptq", "layer_errors", "export"}));
  const std::vector<std::string> gptq = applying(shipped("gpt2_w4_gptq.yaml"));
  EXPECT_NE(std::find(gptq.begin(), gptq.end(), "solve"), gptq.end());
  const std::vector<std::string> mixed = applying(shipped("fmnist_cnn_mixed.yaml"));
  EXPECT_NE(std::find(mixed.begin(), mixed.end(), "search"), mixed.end());
}

TEST(StageRegistry, CalibrateAndPtqAreRequestedTogether) {
  for (const char* name : {"calibrate", "ptq"}) {
    EXPECT_TRUE(pipeline::calibrate_stage().requested({name})) << name;
    EXPECT_TRUE(pipeline::ptq_stage().requested({name})) << name;
  }
  EXPECT_FALSE(pipeline::calibrate_stage().requested({"float"}));
  EXPECT_TRUE(pipeline::data_stage().requested({"float"}));
  EXPECT_TRUE(pipeline::freeze_stage().requested({}));
}

TEST(StageRegistry, StagesNeedingTheCalibratedModelAreRefusedWithoutCalibrate) {
  const Recipe r = shipped("bert_int8.yaml");
  for (const char* stage : {"qat", "freeze"}) {
    try {
      check_stages(r, {"float", stage});
      ADD_FAILURE() << stage << " accepted without calibrate";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + stage + "' needs the model quantized and calibrated"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(check_stages(r, {"float", "calibrate", "qat", "freeze"}));
  EXPECT_NO_THROW(check_stages(r, {"float", "ptq", "freeze"}));
  // A stage the recipe does not ask for is no reason to refuse.
  EXPECT_NO_THROW(check_stages(shipped("bert_int8.yaml", {"qat.epochs=0"}), {"float", "qat"}));
}

// Issue 39 item 5: `--stages export` wrote a float model.onnx and model.h5 (no calibrate ran) with
// no warning; export now needs calibrate, and freeze when the recipe freezes.
TEST(StageRegistry, Issue39Item5ExportAloneIsRefusedAndExportsWhatTheWholeRunWould) {
  const Recipe r = shipped("fmnist_cnn_int8.yaml", {"export.onnx=true"});
  std::string e;
  try {
    check_stages(r, {"export"});
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("'export' needs the model quantized and calibrated"), std::string::npos) << e;
  e.clear();
  try {
    check_stages(r, {"calibrate", "export"});
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("'export' writes the frozen model"), std::string::npos) << e;
  EXPECT_NO_THROW(check_stages(r, {"calibrate", "freeze", "export"}));
  EXPECT_NO_THROW(check_stages(shipped("fmnist_cnn_int8.yaml", {"freeze.enabled=false"}), {"calibrate", "export"}));
  EXPECT_NO_THROW(check_stages(r, {"float", "calibrate"}));
}
