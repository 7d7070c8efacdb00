// The profile cache: kept per key, persisted as JSON and read back at start, and not used
// once older than its max age (tandem-coordinator --profile-max-age).
#include "coordinator/profile_store.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

// A profile of `key` measured at `at`, its one layer's forward taking `forward` seconds.
v1::ModelProfile ProfileOf(const std::string& key, absl::Time at, double forward = 0.001) {
  v1::ModelProfile p;
  p.set_key(key);
  p.set_device("cpu");
  p.set_threads(1);
  p.set_created_unix_ms(absl::ToUnixMillis(at));
  v1::LayerProfile* layer = p.add_layers();
  layer->set_layer(0);
  layer->set_forward_seconds(forward);
  return p;
}

struct TempDir {
  TempDir() {
    char dir_template[] = "/tmp/tandem-profiles-XXXXXX";
    path = mkdtemp(dir_template);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

TEST(ProfileStoreTest, KeepsAProfilePerKeyAndReadsThemBackAtStart) {
  TempDir dir;
  const absl::Time t = absl::FromUnixSeconds(1'800'000'000);
  {
    ProfileStore store(dir.path);
    ASSERT_TRUE(store.Put(ProfileOf("gpt-a/cpu", t, 0.001)).ok());
    ASSERT_TRUE(store.Put(ProfileOf("gpt-b/cpu", t, 0.002)).ok());
    ASSERT_TRUE(store.Put(ProfileOf("gpt-a/cpu", t, 0.003)).ok());  // measured again: replaced
    EXPECT_FALSE(store.Find("gpt-c/cpu").has_value());
  }
  // An unreadable file beside them is skipped.
  std::ofstream(dir.path + "/broken.json") << "{ not json";
  ProfileStore reread(dir.path);
  ASSERT_TRUE(reread.Find("gpt-a/cpu").has_value());
  EXPECT_DOUBLE_EQ(reread.Find("gpt-a/cpu")->layers(0).forward_seconds(), 0.003);
  ASSERT_TRUE(reread.Find("gpt-b/cpu").has_value());
  EXPECT_DOUBLE_EQ(reread.Find("gpt-b/cpu")->layers(0).forward_seconds(), 0.002);
  EXPECT_EQ(reread.Find("gpt-b/cpu")->created_unix_ms(), absl::ToUnixMillis(t));
}

// Without a max age a profile plans jobs however old it is, as before.
TEST(ProfileStoreTest, WithoutAMaxAgeAProfileIsUsedAtAnyAge) {
  ProfileStore store("");
  const absl::Time t = absl::FromUnixSeconds(1'800'000'000);
  ASSERT_TRUE(store.Put(ProfileOf("k", t)).ok());
  EXPECT_TRUE(store.Find("k", t + absl::Hours(24 * 365)).has_value());
  ASSERT_TRUE(store.Put(ProfileOf("no-time", absl::UnixEpoch())).ok());
  EXPECT_TRUE(store.Find("no-time", t).has_value());
}

// Past its max age a profile is not found, so the next job that needs it measures it again;
// the new measurement replaces it and is found until it too is that old.
TEST(ProfileStoreTest, AProfileOlderThanTheMaxAgeIsNotFoundUntilMeasuredAgain) {
  TempDir dir;
  const absl::Time t = absl::FromUnixSeconds(1'800'000'000);
  ProfileStore store(dir.path, absl::Minutes(10));
  ASSERT_TRUE(store.Put(ProfileOf("k", t, 0.001)).ok());
  EXPECT_TRUE(store.Find("k", t).has_value());
  EXPECT_TRUE(store.Find("k", t + absl::Minutes(10)).has_value());  // exactly the max age
  EXPECT_FALSE(store.Find("k", t + absl::Minutes(10) + absl::Seconds(1)).has_value());
  EXPECT_FALSE(store.Find("k", t + absl::Hours(1)).has_value());  // asked again: still too old
  const absl::Time later = t + absl::Hours(1);
  ASSERT_TRUE(store.Put(ProfileOf("k", later, 0.002)).ok());
  ASSERT_TRUE(store.Find("k", later + absl::Minutes(5)).has_value());
  EXPECT_DOUBLE_EQ(store.Find("k", later)->layers(0).forward_seconds(), 0.002);
  // A coordinator started again with the same max age reads the profile's own time from disk.
  ProfileStore reread(dir.path, absl::Minutes(10));
  EXPECT_TRUE(reread.Find("k", later + absl::Minutes(9)).has_value());
  EXPECT_FALSE(reread.Find("k", later + absl::Minutes(11)).has_value());
}

// A max age of zero measures for every job; a profile that carries no time (written by hand)
// is of unknown age, and not used once a max age is set.
TEST(ProfileStoreTest, AZeroMaxAgeOrAProfileWithoutATimeIsNeverFound) {
  ProfileStore store("", absl::ZeroDuration());
  const absl::Time t = absl::FromUnixSeconds(1'800'000'000);
  ASSERT_TRUE(store.Put(ProfileOf("k", t)).ok());
  EXPECT_TRUE(store.Find("k", t).has_value());  // the same instant: zero old
  EXPECT_FALSE(store.Find("k", t + absl::Milliseconds(1)).has_value());
  ProfileStore day("", absl::Hours(24));
  ASSERT_TRUE(day.Put(ProfileOf("no-time", absl::UnixEpoch())).ok());
  EXPECT_FALSE(day.Find("no-time", t).has_value());
}

}  // namespace
}  // namespace tandem::coordinator
