#include "worker/backend/cuda/module_loading.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace tandem::worker::cuda {
namespace {

std::string Env() {
  const char* v = std::getenv(kModuleLoadingVariable);
  return v == nullptr ? "<unset>" : v;
}

TEST(ModuleLoadingTest, SetsEagerWhenUnset) {
  unsetenv(kModuleLoadingVariable);
  EXPECT_EQ(UseEagerModuleLoading(), "");
  EXPECT_EQ(Env(), "EAGER");
}

TEST(ModuleLoadingTest, OverridesLazyAndSaysWhatItReplaced) {
  // LAZY is what brings the first-step hang back: it must not survive.
  setenv(kModuleLoadingVariable, "LAZY", 1);
  EXPECT_EQ(UseEagerModuleLoading(), "LAZY");
  EXPECT_EQ(Env(), "EAGER");
  EXPECT_EQ(UseEagerModuleLoading(), "EAGER");  // idempotent
  EXPECT_EQ(Env(), "EAGER");
}

// The setting only counts before the runtime's first call, which no CPU machine can observe;
// what can be held is the order: it is tandem-worker's first statement, before flags, logging
// or any thread. (The benchmarks do the same; the tests get it from CudaDeviceCount.)
TEST(ModuleLoadingTest, WorkerMainSetsItFirst) {
  std::string path = std::string(TANDEM_SOURCE_DIR) + "/worker/main.cc";
  FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr) << path;
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
  std::fclose(f);
  const size_t main_at = text.find("int main(int argc, char** argv) {");
  ASSERT_NE(main_at, std::string::npos);
  // The first statement of main (after comment lines) is the call.
  size_t at = text.find('\n', main_at) + 1;
  while (text.compare(text.find_first_not_of(' ', at), 2, "//") == 0) at = text.find('\n', at) + 1;
  const size_t stmt = text.find_first_not_of(' ', at);
  EXPECT_EQ(text.compare(stmt, 45, "tandem::worker::cuda::UseEagerModuleLoading()"), 0)
      << text.substr(stmt, 80);
}

}  // namespace
}  // namespace tandem::worker::cuda
