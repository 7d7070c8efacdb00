#include "common/format_bytes.h"

#include "absl/strings/str_format.h"

namespace tandem {

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return absl::StrFormat("%.1f GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return absl::StrFormat("%.1f MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return absl::StrFormat("%.0f KiB", b / 1024.0);
  return absl::StrFormat("%d B", bytes);
}

}  // namespace tandem
