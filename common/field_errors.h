// Errors about the fields of a document (a job spec), each naming the field's path and, where
// the document was YAML text, the line where the field is written. A FieldErrors collects every
// error of a document, so that one answer lists them all, as compilers, protoc and kubectl do.
//
// The text form, which is ToStatus's message, what the coordinator answers and what `tandem`
// restates as "FILE:LINE: path: what", is one error per line, in the order found:
//
//   <path>: <what>[ (line L[, column C])]
//
// <path> is a field path ("pipeline.micro_batches", "pipeline.cuts[1]"), a section for a rule
// on several of its fields ("model"), or the document's name for the whole text ("job spec").
// Lines that start with two spaces continue the error above them (a schedule's grid). Past
// kMaxFieldErrors errors, a last line says how many more were found. The first line is the
// first error found, so a reader that keeps one line (a log, a job's reason) keeps the most
// important one.
//
// Thread-safety: a FieldErrors is a value; the functions are pure.
#ifndef TANDEM_COMMON_FIELD_ERRORS_H_
#define TANDEM_COMMON_FIELD_ERRORS_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// At most this many errors are kept (clang stops at 20, protoc at none): enough to fix a spec
// in one round trip, and a bound on an answer built from untrusted text.
inline constexpr int kMaxFieldErrors = 50;

struct FieldError {
  std::string path;  // see the file comment; empty for a line of text that names no path
  std::string what;  // what was expected and what was found: "must be in [1, 65536], got 0"
  int line = 0;      // 1-based; 0 where unknown (a default, a preset, a spec given as a proto)
  int column = 0;    // 1-based; 0 where only the line is known
};

// Where each field of a YAML document is written: its path ("pipeline.cuts[1]") -> the 1-based
// line of its key (of the item, for a list item).
using FieldLines = std::map<std::string, int, std::less<>>;

class FieldErrors {
 public:
  // Records an error, or only counts it once kMaxFieldErrors are recorded. Each further line
  // of `what` becomes a continuation line (indented by two spaces); '\r' is dropped.
  void Add(absl::string_view path, absl::string_view what, int line = 0, int column = 0);

  bool empty() const { return errors_.empty(); }
  int size() const { return static_cast<int>(errors_.size()); }
  // Whether an error names exactly `path`: rules that read a field skip it when it is wrong,
  // so that one mistake is reported once. Always true past kMaxFieldErrors, whose paths are not
  // kept: a rule must not run on a field that may be wrong.
  bool Has(absl::string_view path) const;
  const std::vector<FieldError>& errors() const { return errors_; }

  // Gives each error without a line the line of its path in `lines`, where it is written.
  void AttachLines(const FieldLines& lines);

  // OK when empty; otherwise INVALID_ARGUMENT whose message is the text form.
  absl::Status ToStatus() const;

 private:
  std::vector<FieldError> errors_;
  int dropped_ = 0;  // errors found beyond kMaxFieldErrors
};

// One error in the text form: "<path>: <what> (line L, column C)", continuation lines kept.
std::string FormatFieldError(const FieldError& e);

// Reads the text form back, for a client that restates an answer: each error's path, what,
// line and column; continuation lines stay in `what`. A line that is not "<path>: <what>" is
// kept whole in `what` with an empty path. At most `max_errors` errors, each of at most
// `max_lines_per_error` continuation lines, are read (the text may come from the network).
std::vector<FieldError> ParseFieldErrors(absl::string_view text, int max_errors = kMaxFieldErrors,
                                         int max_lines_per_error = 64);

}  // namespace tandem

#endif  // TANDEM_COMMON_FIELD_ERRORS_H_
