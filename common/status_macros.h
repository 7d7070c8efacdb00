// The one way fallible code propagates errors: RETURN_IF_ERROR, ASSIGN_OR_RETURN, and
// WithPrefix, which adds context to a message while keeping the code and every payload.
//
//   RETURN_IF_ERROR(store->Put(profile));
//   ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(spec, profile));
//   RETURN_IF_ERROR(WithPrefix(Connect(peer), "stage 2"));   // "stage 2: <message>"
//
// The macros evaluate their expression once. They work in any function returning
// absl::Status or absl::StatusOr<T> (both convert from a non-OK absl::Status).
#ifndef TANDEM_COMMON_STATUS_MACROS_H_
#define TANDEM_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tandem {

// `s` with "<prefix>: " in front of its message; the code and the payloads (for example
// the partitioner's smallest feasible budget) are kept. An OK status stays OK.
inline absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat(prefix, ": ", s.message()));
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

namespace status_internal {
inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace status_internal

}  // namespace tandem

#define TANDEM_STATUS_CONCAT_INNER_(a, b) a##b
#define TANDEM_STATUS_CONCAT_(a, b) TANDEM_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` (an absl::Status, or the status of an absl::StatusOr) from the
// enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                 \
    if (const auto& tandem_status_ = (expr);                                           \
        !::tandem::status_internal::AsStatus(tandem_status_).ok()) {                   \
      return ::tandem::status_internal::AsStatus(tandem_status_);                      \
    }                                                                                  \
  } while (false)

// `lhs` (a declaration such as `auto x` or `Foo x`, or an existing variable) gets the value of
// the absl::StatusOr `rexpr`, or the enclosing function returns its error.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_STATUS_CONCAT_(tandem_statusor_, __LINE__), lhs, rexpr)

#define TANDEM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // TANDEM_COMMON_STATUS_MACROS_H_
