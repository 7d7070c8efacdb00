// The coordinator's recent speed checks, for the profiles it serves outside a job (`tandem
// plan`, its planner search): a job's planning checks a cached profile once per plan and gives
// every cached profile of the plan that verdict (JobPlanner::SpeedChecked), and a plan asked of
// the coordinator should be priced the same way, though it comes as one ProfileModel call per
// micro-batch size. So a verdict is kept per profile family (the model, optimizer, device kind,
// threads and hardware of ProfileKey, any micro-batch size) and stands for as long as a profile
// stands unchecked (--profile-speed-check): the host's speed then is known as well as a fresh
// profile would know it.
//
// Thread-safe: the coordinator's RPC threads share one.
#ifndef TANDEM_COORDINATOR_SPEED_CHECK_MEMO_H_
#define TANDEM_COORDINATOR_SPEED_CHECK_MEMO_H_

#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/profile_speed_check.h"

namespace tandem::coordinator {

class SpeedCheckMemo {
 public:
  struct Verdict {
    SpeedCheck check;
    absl::Time made;
  };

  // Checks a cached profile at least `after` old; infinite: never (Checks() is false).
  explicit SpeedCheckMemo(absl::Duration after) : after_(after) {}

  absl::Duration after() const { return after_; }
  // Whether a profile measured `age` ago is checked before it is served.
  bool Checks(absl::Duration age) const { return SpeedCheckDue(age, after_); }
  // The verdict of `family` made within `after` before `now`, if any.
  std::optional<Verdict> Find(const std::string& family, absl::Time now) const;
  // Keeps `check` as `family`'s verdict, made at `now` (replacing an older one).
  void Put(const std::string& family, SpeedCheck check, absl::Time now);

 private:
  const absl::Duration after_;
  mutable absl::Mutex mu_;
  std::map<std::string, Verdict> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_SPEED_CHECK_MEMO_H_
