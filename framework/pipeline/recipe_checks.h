// Checks of a recipe against the built model, before the stages that take time: errors about a
// search candidate or a ptq rule are recipe errors at the line that wrote it.
#pragma once

#include <torch/nn/module.h>

#include <vector>

#include "framework/ptq/ptq.h"
#include "framework/recipe/recipe.h"
#include "framework/search/search.h"

namespace qforge::pipeline {

// The solver plan; a rule naming a method no matching layer can take is a RecipeError at the rule.
std::vector<ptq::LayerSolve> check_solve_recipe(const torch::nn::Module& model, const Recipe& r);

// The search's own checks; a candidate no layer can take is a RecipeError at the candidate.
void check_search_recipe(torch::nn::Module& model, const Recipe& r, const search::SearchOptions& so);

// export.onnx's requirements: libonnx in the build, a frozen model, and (given a quantized model)
// a QDQ form for every layer's scheme.
void check_onnx_recipe(const Recipe& r, const torch::nn::Module* model);

}  // namespace qforge::pipeline
