#include "worker/grad_reducer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/shard_range.h"
#include "common/status_macros.h"
#include "worker/transport/ring_allreduce.h"

namespace tandem::worker {
namespace {

// Tensors below this many floats (1 MiB) travel coalesced with the bucket's other small ones.
constexpr size_t kCoalesceBelow = size_t{1} << 18;

}  // namespace

GradReducer::GradReducer(std::unique_ptr<Transport> group) : group_(std::move(group)) {
  thread_ = std::thread([this] { Loop(); });
}

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
  using Op = GradBucket::Op;
  const int ranks = group_->size();
  const int me = group_->rank();
  size_t small = 0;
  for (const absl::Span<float>& t : bucket.tensors) {
    if (t.size() < kCoalesceBelow) small += t.size();
  }
  for (const absl::Span<float>& t : bucket.tensors) {
    if (t.size() < kCoalesceBelow) continue;
    const RingAllReduceOptions options{.id = next_id_++};
    switch (bucket.op) {
      case Op::kAllReduce:
        RETURN_IF_ERROR(RingAllReduce(*group_, t.data(), t.size(), scratch_, options));
        break;
      case Op::kReduceScatter:
        RETURN_IF_ERROR(RingReduceScatter(*group_, t.data(), t.size(), scratch_, options));
        break;
      case Op::kAllGather:
        RETURN_IF_ERROR(RingAllGather(*group_, t.data(), t.size(), options));
        break;
    }
  }
  if (small == 0) return absl::OkStatus();
  staging_.resize(small);
  size_t at = 0;
  for (const absl::Span<float>& t : bucket.tensors) {
    if (t.size() >= kCoalesceBelow) continue;
    if (bucket.op == Op::kAllGather) {
      // Only the owner's segment is non-zero: the sum is an exact copy of it.
      std::fill(staging_.data() + at, staging_.data() + at + t.size(), 0.0f);
      const ElementRange own = OwnedSegment(t.size(), ranks, me);
      std::memcpy(staging_.data() + at + own.begin, t.data() + own.begin,
                  own.size() * sizeof(float));
    } else {
      std::memcpy(staging_.data() + at, t.data(), t.size() * sizeof(float));
    }
    at += t.size();
  }
  RETURN_IF_ERROR(RingAllReduce(*group_, staging_.data(), small, scratch_, {.id = next_id_++}));
  at = 0;
  for (const absl::Span<float>& t : bucket.tensors) {
    if (t.size() >= kCoalesceBelow) continue;
    std::memcpy(t.data(), staging_.data() + at, t.size() * sizeof(float));
    at += t.size();
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker
