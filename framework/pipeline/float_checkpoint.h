// The float stage's checkpoint: the float weights with a provenance record (architecture, data,
// training, seed) on its first line, so a later run loads them only if it would train the same.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "framework/recipe/recipe.h"

namespace qforge::pipeline {

void save_float_checkpoint(torch::nn::Module& model, const std::string& path, const Recipe& r);

// Checks the checkpoint's provenance record against the recipe without loading weights (the dry
// run): returns a note, throws naming every setting that differs.
std::string check_float_checkpoint(const std::string& path, const Recipe& r);

// Loads the float weights after checking the checkpoint was trained as this recipe would train
// them. Returns the report note; throws naming every setting that differs.
std::string load_float_checkpoint(torch::nn::Module& model, const std::string& path, const Recipe& r);

}  // namespace qforge::pipeline
