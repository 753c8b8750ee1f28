// Checks of a recipe against the built model (recipe_checks.h).
#include "framework/pipeline/recipe_checks.h"

#include "framework/onnx/export.h"
#include "framework/pipeline/recipe_options.h"

namespace qforge::pipeline {

namespace {

// An error about the recipe entry `index` of `sites` (a search candidate, a ptq rule) as a recipe
// error at that entry's file:line:column; rethrows the current exception when there is none.
[[noreturn]] void throw_at_site(const std::vector<RecipeIssue>& sites, int index, const char* what) {
  if (index < 0 || index >= static_cast<int>(sites.size())) throw;
  RecipeIssue issue = sites[static_cast<size_t>(index)];
  issue.message = what;
  throw RecipeError({issue});
}

}  // namespace

std::vector<ptq::LayerSolve> check_solve_recipe(const torch::nn::Module& model, const Recipe& r) {
  try {
    return ptq::plan_solve(model, solve_options(r));
  } catch (const ptq::SolveError& e) {
    throw_at_site(r.ptq.rule_sites, e.rule(), e.what());
  }
}

void check_search_recipe(torch::nn::Module& model, const Recipe& r, const search::SearchOptions& so) {
  try {
    search::check_search(model, r.scheme, so);
  } catch (const search::SearchError& e) {
    throw_at_site(r.search.candidate_sites, e.candidate(), e.what());
  }
}

void check_onnx_recipe(const Recipe& r, const torch::nn::Module* model) {
  onnx_export::require_available();
  QF_REQUIRE(!r.quantize || r.freeze.enabled, r.path, ": export.onnx writes the frozen model; set freeze.enabled: true (or export.onnx: false)");
  if (model) onnx_export::check_exportable(*model);
}

}  // namespace qforge::pipeline
