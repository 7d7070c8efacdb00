#include "worker/backend/cuda/module_loading.h"

#include <cstdlib>

namespace tandem::worker::cuda {

std::string UseEagerModuleLoading() {
  const char* previous = std::getenv(kModuleLoadingVariable);
  std::string was = previous == nullptr ? "" : previous;
  if (was != "EAGER") setenv(kModuleLoadingVariable, "EAGER", /*overwrite=*/1);
  return was;
}

}  // namespace tandem::worker::cuda
