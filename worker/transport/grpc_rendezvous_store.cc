#include "worker/transport/grpc_rendezvous_store.h"

#include <gloo/common/error.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc.h"
#include "common/version.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace tandem::worker {
namespace {

constexpr std::chrono::milliseconds kSlice{1000};
constexpr std::chrono::milliseconds kRetryPause{200};

}  // namespace

class GrpcRendezvousStore::Impl {
 public:
  Impl(std::shared_ptr<grpc::Channel> channel, GrpcRendezvousStoreOptions options)
      : stub_(v1::Rendezvous::NewStub(channel)), options_(std::move(options)) {}

  void Set(const std::string& key, const std::vector<char>& data) {
    ThrowIfCancelled(key);
    v1::RendezvousSetRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_key(options_.prefix + key);
    req.set_value(std::string(data.begin(), data.end()));
    const auto deadline = std::chrono::steady_clock::now() + options_.wait_timeout;
    while (true) {
      grpc::ClientContext ctx;
      SetDeadline(ctx, options_.rpc_timeout);
      v1::RendezvousSetResponse resp;
      grpc::Status s = stub_->Set(&ctx, req, &resp);
      if (s.ok()) return;
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
          std::chrono::steady_clock::now() + kRetryPause > deadline) {
        throw gloo::IoException(absl::StrCat("rendezvous set of '", req.key(),
                                             "' failed: ", FromGrpcStatus(s).ToString()));
      }
      std::this_thread::sleep_for(kRetryPause);
      ThrowIfCancelled(key);
    }
  }

  // Values of `keys`, waiting up to `timeout` for all of them.
  std::vector<std::string> Get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) {
    v1::RendezvousGetRequest req;
    req.set_protocol_version(kProtocolVersion);
    for (const std::string& k : keys) req.add_keys(options_.prefix + k);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      ThrowIfCancelled(absl::StrJoin(req.keys(), ", "));
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      const auto slice = std::clamp(left, std::chrono::milliseconds(0), kSlice);
      req.set_wait_ms(slice.count());
      grpc::ClientContext ctx;
      SetDeadline(ctx, slice + options_.rpc_timeout);
      v1::RendezvousGetResponse resp;
      grpc::Status s = stub_->Get(&ctx, req, &resp);
      if (s.ok()) {
        if (resp.values_size() != req.keys_size()) {
          throw gloo::IoException(absl::StrCat("rendezvous get: asked for ", req.keys_size(),
                                               " keys, got ", resp.values_size(), " values"));
        }
        return {resp.values().begin(), resp.values().end()};
      }
      const bool retry = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                         s.error_code() == grpc::StatusCode::UNAVAILABLE;
      if (!retry || std::chrono::steady_clock::now() >= deadline) {
        // "Timed out" lets GlooTransport::Connect report DEADLINE_EXCEEDED.
        throw gloo::IoException(absl::StrCat(
            retry ? "Timed out after " : "", retry ? absl::StrCat(timeout.count(), " ms ") : "",
            "waiting for rendezvous keys [", absl::StrJoin(req.keys(), ", "),
            "]: ", FromGrpcStatus(s).ToString()));
      }
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) std::this_thread::sleep_for(kRetryPause);
    }
  }

  std::chrono::milliseconds wait_timeout() const { return options_.wait_timeout; }

 private:
  void ThrowIfCancelled(const std::string& what) const {
    if (options_.cancelled != nullptr && options_.cancelled->load()) {
      throw gloo::IoException(absl::StrCat("rendezvous cancelled (", what, ")"));
    }
  }

  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  const GrpcRendezvousStoreOptions options_;
};

GrpcRendezvousStore::GrpcRendezvousStore(std::shared_ptr<grpc::Channel> channel,
                                         GrpcRendezvousStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(channel), std::move(options))) {}

GrpcRendezvousStore::~GrpcRendezvousStore() = default;

void GrpcRendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  impl_->Set(key, data);
}

std::vector<char> GrpcRendezvousStore::get(const std::string& key) {
  std::vector<std::string> values = impl_->Get({key}, impl_->wait_timeout());
  return std::vector<char>(values[0].begin(), values[0].end());
}

void GrpcRendezvousStore::wait(const std::vector<std::string>& keys) {
  impl_->Get(keys, impl_->wait_timeout());
}

void GrpcRendezvousStore::wait(const std::vector<std::string>& keys,
                               const std::chrono::milliseconds& timeout) {
  impl_->Get(keys, timeout);
}

}  // namespace tandem::worker
