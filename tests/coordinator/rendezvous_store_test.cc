// The rendezvous store the workers meet through.
#include "coordinator/rendezvous_store.h"

#include <chrono>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(RendezvousStoreTest, GetWaitsForKeysAndNamesTheMissing) {
  RendezvousStore kv;
  std::thread setter([&] {
    std::this_thread::sleep_for(30ms);
    ASSERT_TRUE(kv.Set("job-1/a", "1").ok());
  });
  auto got = kv.Get({"job-1/a"}, absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0], "1");
  auto missing = kv.Get({"job-1/a", "job-1/b"}, absl::Milliseconds(20));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("job-1/b"));
  EXPECT_EQ(kv.Set("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("k", std::string(RendezvousStore::kMaxValueBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv.Set("job-2/a", "2").ok());
  kv.ErasePrefix("job-1/");
  EXPECT_EQ(kv.size(), 1u);
}

}  // namespace
}  // namespace tandem::coordinator
