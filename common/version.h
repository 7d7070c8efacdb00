// Version constants shared by every Tandem program.
#ifndef TANDEM_COMMON_VERSION_H_
#define TANDEM_COMMON_VERSION_H_

#include <cstdint>

namespace tandem {

// The control-plane protocol this build speaks; see tandem.v1.ProtocolVersion.
inline constexpr uint32_t kProtocolVersion = 5;
inline constexpr const char* kVersion = "0.1.0";

}  // namespace tandem

#endif  // TANDEM_COMMON_VERSION_H_
