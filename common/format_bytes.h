// Byte counts for people: in messages, the CLI's tables and the dashboard's JSON-free text.
#ifndef TANDEM_COMMON_FORMAT_BYTES_H_
#define TANDEM_COMMON_FORMAT_BYTES_H_

#include <cstdint>
#include <string>

namespace tandem {

// "1.5 GiB", "243.1 MiB", "12 KiB", "0 B" (binary units, one decimal from MiB up).
std::string FormatBytes(int64_t bytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_FORMAT_BYTES_H_
