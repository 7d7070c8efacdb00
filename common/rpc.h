// Helpers shared by the gRPC adapters: status translation, deadlines, protocol-version checks.
// Only adapter code (services, clients) includes this header.
#ifndef TANDEM_COMMON_RPC_H_
#define TANDEM_COMMON_RPC_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/relayed_rank.h"

namespace tandem {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// Refuses a request whose protocol_version is not the one this build speaks.
absl::Status CheckProtocolVersion(uint32_t version, const char* server_name);

// The trailing metadata key under which a relaying worker names the rank whose forwarded call
// failed (common/relayed_rank.h).
inline constexpr char kRelayedRankKey[] = "tandem-relayed-rank";
// FromGrpcStatus, with the relayed rank of the call's trailing metadata attached (if any).
absl::Status FromGrpcCall(const grpc::Status& s, const grpc::ClientContext& ctx);

// Every client call carries a deadline.
inline void SetDeadline(grpc::ClientContext& ctx, std::chrono::milliseconds timeout) {
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
}

// The arguments of every channel the project makes: message size, fast reconnects.
grpc::ChannelArguments DefaultChannelArguments();

// A plaintext, unauthenticated channel to HOST:PORT, named so that no one dials in the clear by
// accident: the daemons and the CLI dial through common/tls.h's MakeChannel(address,
// ChannelSecurity), which calls this only when the configuration says TLS is off. Tests use it
// to speak to plaintext servers, and to check that TLS servers refuse plaintext.
std::shared_ptr<grpc::Channel> MakeInsecureChannel(const std::string& address);

// Writes `port` to `path` atomically (tmp + rename), for tests and scripts that start a daemon
// on port 0.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace tandem

#endif  // TANDEM_COMMON_RPC_H_
