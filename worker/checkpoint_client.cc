#include "worker/checkpoint_client.h"

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "common/safetensors.h"
#include "common/step_number.h"
#include "common/version.h"
#include "tandem/v1/coordinator.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::worker {

namespace {

// Reads a stream of TensorChunk (the index, then the tensors' bytes in index order) into `out`.
absl::Status ReadTensorStream(grpc::ClientContext& ctx,
                              grpc::ClientReaderInterface<v1::TensorChunk>& reader,
                              const std::string& what, std::map<std::string, std::string>* out) {
  v1::TensorChunk chunk;
  std::vector<std::pair<std::string, int64_t>> sizes;  // in stream order
  size_t current = 0;
  bool have_index = false;
  while (reader.Read(&chunk)) {
    if (!have_index) {
      for (const auto& m : chunk.index()) {
        TensorInfo info{m.name(), m.dtype(), {m.shape().begin(), m.shape().end()}};
        if (info.ByteSize() < 0) {
          ctx.TryCancel();
          return absl::DataLossError(absl::StrCat(what, ": bad index entry ", m.name()));
        }
        sizes.push_back({m.name(), info.ByteSize()});
        (*out)[m.name()].reserve(static_cast<size_t>(info.ByteSize()));
      }
      have_index = true;
      continue;
    }
    absl::string_view data = chunk.data();
    while (!data.empty()) {
      while (current < sizes.size() &&
             static_cast<int64_t>((*out)[sizes[current].first].size()) == sizes[current].second) {
        ++current;
      }
      if (current == sizes.size()) {
        ctx.TryCancel();
        return absl::DataLossError(absl::StrCat(what, ": more data than the index declares"));
      }
      std::string& dst = (*out)[sizes[current].first];
      const size_t take =
          std::min(data.size(), static_cast<size_t>(sizes[current].second) - dst.size());
      dst.append(data.data(), take);
      data.remove_prefix(take);
    }
  }
  grpc::Status s = reader.Finish();
  if (!s.ok())
    return absl::Status(FromGrpcStatus(s).code(), absl::StrCat(what, ": ", s.error_message()));
  for (const auto& [name, bytes] : sizes) {
    if (static_cast<int64_t>((*out)[name].size()) != bytes) {
      return absl::DataLossError(absl::StrCat(what, ": tensor ", name, " arrived incomplete"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

TensorSource MakeGrpcTensorSource(std::shared_ptr<grpc::Channel> coordinator,
                                  std::chrono::milliseconds timeout) {
  std::shared_ptr<v1::Checkpoints::Stub> stub = v1::Checkpoints::NewStub(std::move(coordinator));
  return [stub, timeout](const v1::CheckpointRef& checkpoint, const std::vector<std::string>& names,
                         std::map<std::string, std::string>* out) -> absl::Status {
    const std::string what =
        absl::StrCat("reading checkpoint ", checkpoint.job_id(), " step ", checkpoint.step());
    v1::ReadTensorsRequest req;
    req.set_protocol_version(kProtocolVersion);
    *req.mutable_checkpoint() = checkpoint;
    for (const auto& n : names) req.add_names(n);
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout);
    auto reader = stub->ReadTensors(&ctx, req);
    return ReadTensorStream(ctx, *reader, what, out);
  };
}

PeerStateReader MakeGrpcPeerStateReader(
    std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> channel_for,
    std::chrono::milliseconds timeout) {
  return [channel_for = std::move(channel_for), timeout](
             const std::string& address, const v1::CheckpointRef& state,
             const std::vector<std::string>& names,
             std::map<std::string, std::string>* out) -> absl::Status {
    const std::string what =
        absl::StrCat("reading the state of job ", state.job_id(), " after step ",
                     StepNumber(state.step()), " from ", address);
    std::unique_ptr<v1::StageWorker::Stub> stub = v1::StageWorker::NewStub(channel_for(address));
    v1::ReadStateRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_job_id(state.job_id());
    req.set_step(state.step());
    for (const auto& n : names) req.add_names(n);
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout);
    auto reader = stub->ReadState(&ctx, req);
    return ReadTensorStream(ctx, *reader, what, out);
  };
}

}  // namespace tandem::worker
