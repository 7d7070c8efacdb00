#include "common/rpc.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// The C++ servers and clients (kProtocolVersion) and the Python client
// (PROTOCOL_VERSION_CURRENT) speak one protocol.
static_assert(kProtocolVersion == static_cast<uint32_t>(v1::PROTOCOL_VERSION_CURRENT),
              "common/version.h and proto/tandem/v1/common.proto disagree on the protocol");

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::Status FromGrpcCall(const grpc::Status& s, const grpc::ClientContext& ctx) {
  absl::Status status = FromGrpcStatus(s);
  if (status.ok()) return status;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  const auto it = trailers.find(kRelayedRankKey);
  int rank = -1;
  if (it != trailers.end() &&
      absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &rank)) {
    status = WithRelayedRank(std::move(status), rank);
  }
  return status;
}

absl::Status CheckProtocolVersion(uint32_t version, const char* server_name) {
  if (version == kProtocolVersion) return absl::OkStatus();
  if (version == 0) {
    return absl::FailedPreconditionError(absl::StrCat("request carries no protocol_version; this ",
                                                      server_name, " speaks tandem.v1 protocol ",
                                                      kProtocolVersion));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("protocol version ", version, " is not supported; this ", server_name,
                   " speaks tandem.v1 protocol ", kProtocolVersion));
}

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Fail fast on a dead peer instead of backing off for seconds.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

std::shared_ptr<grpc::Channel> MakeInsecureChannel(const std::string& address) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   DefaultChannelArguments());
}

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::InternalError(absl::StrCat("cannot write port file ", tmp));
    out << port << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename port file to ", path));
  }
  return absl::OkStatus();
}

}  // namespace tandem
