#include "worker/grad_reducer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "worker/transport/ring_collectives.h"

namespace tandem::worker {
GradReducer::GradReducer(std::unique_ptr<GroupCollectives> group) : group_(std::move(group)) {
  thread_ = std::thread([this] { Loop(); });
}

GradReducer::GradReducer(std::unique_ptr<Transport> group)
    : GradReducer(NewRingCollectives(std::move(group))) {}

GradReducer::~GradReducer() {
  Abort();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void GradReducer::Abort() {
  group_->Abort();
  absl::MutexLock lock(&mu_);
  if (status_.ok()) status_ = absl::AbortedError("the gradient reduction was aborted");
}

absl::Status GradReducer::BeginStep() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(status_);
  if (in_flight_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(in_flight_, " gradient bucket(s) of the last step are still reducing"));
  }
  spans_.clear();
  bytes_ = 0;
  return absl::OkStatus();
}

void GradReducer::Post(GradBucket bucket) {
  bucket.posted_us = UnixMicros();
  absl::MutexLock lock(&mu_);
  ++in_flight_;
  queue_.push_back(std::move(bucket));
}

absl::Status GradReducer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &in_flight_));
  return status_;
}

GradReducer::ChunkSpan GradReducer::span_of(int chunk) const {
  absl::MutexLock lock(&mu_);
  return chunk >= 0 && static_cast<size_t>(chunk) < spans_.size() ? spans_[chunk] : ChunkSpan{};
}

int64_t GradReducer::step_bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

void GradReducer::Loop() {
  for (;;) {
    GradBucket bucket;
    bool skip = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](GradReducer* r)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->stop_ || !r->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping
      bucket = std::move(queue_.front());
      queue_.pop_front();
      skip = !status_.ok();  // after a failure: drain without touching the group
    }
    const int64_t start = UnixMicros();
    absl::Status s = skip ? absl::OkStatus() : Reduce(bucket);
    const int64_t end = UnixMicros();
    int64_t bytes = 0;
    for (const absl::Span<float>& t : bucket.tensors) bytes += static_cast<int64_t>(t.size() * 4);
    const bool gather = bucket.op == GradBucket::Op::kAllGather;
    absl::MutexLock lock(&mu_);
    if (!s.ok() && status_.ok()) {
      status_ = WithPrefix(s, absl::StrCat(gather ? "parameter all-gather" : "gradient reduction",
                                           " of layer ", bucket.layer));
    }
    if (!skip && s.ok() && !gather) {
      const size_t c = static_cast<size_t>(std::max(0, bucket.chunk));
      if (spans_.size() <= c) spans_.resize(c + 1);
      ChunkSpan& span = spans_[c];
      if (span.start_us == 0) span.start_us = start;
      if (span.first_post_us == 0) span.first_post_us = bucket.posted_us;
      span.end_us = std::max(span.end_us, end);
      bytes_ += bytes;
    }
    --in_flight_;
  }
}

absl::Status GradReducer::Reduce(GradBucket& bucket) {
  return group_->Run(bucket.op, bucket.tensors);
}

}  // namespace tandem::worker
