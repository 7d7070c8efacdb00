#include "common/field_errors.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {
namespace {

constexpr absl::string_view kIndent = "  ";

// " (line L, column C)", " (line L)", or "" where the line is unknown.
std::string Place(int line, int column) {
  if (line <= 0) return "";
  if (column <= 0) return absl::StrCat(" (line ", line, ")");
  return absl::StrCat(" (line ", line, ", column ", column, ")");
}

// Removes a trailing Place() from `text`, setting `line` and `column`; false if it has none.
bool StripPlace(absl::string_view& text, int& line, int& column) {
  if (!absl::EndsWith(text, ")")) return false;
  const size_t open = text.rfind(" (line ");
  if (open == absl::string_view::npos) return false;
  absl::string_view inside = text.substr(open + 7, text.size() - open - 8);
  int l = 0, c = 0;
  const size_t comma = inside.find(", column ");
  if (comma == absl::string_view::npos) {
    if (!absl::SimpleAtoi(inside, &l)) return false;
  } else if (!absl::SimpleAtoi(inside.substr(0, comma), &l) ||
             !absl::SimpleAtoi(inside.substr(comma + 9), &c) || c <= 0) {
    return false;
  }
  if (l <= 0) return false;
  line = l;
  column = c;
  text = text.substr(0, open);
  return true;
}

// Where "<path>: " ends in a line, looking past ": " inside [brackets] (a map key); npos if the
// line has no ": " outside them.
size_t PathEnd(absl::string_view line) {
  int depth = 0;
  for (size_t i = 0; i + 1 < line.size(); ++i) {
    if (line[i] == '[') ++depth;
    if (line[i] == ']' && depth > 0) --depth;
    if (depth == 0 && line[i] == ':' && line[i + 1] == ' ') return i;
  }
  return absl::string_view::npos;
}

}  // namespace

void FieldErrors::Add(absl::string_view path, absl::string_view what, int line, int column) {
  if (size() >= kMaxFieldErrors) {
    ++dropped_;
    return;
  }
  FieldError e{std::string(path), "", line, column};
  bool first = true;
  for (absl::string_view part : absl::StrSplit(what, '\n')) {
    part = absl::StripSuffix(part, "\r");
    if (first) {
      e.what = std::string(part);
      first = false;
    } else if (!absl::StripAsciiWhitespace(part).empty()) {
      absl::StrAppend(&e.what, "\n", absl::StartsWith(part, kIndent) ? "" : kIndent, part);
    }
  }
  errors_.push_back(std::move(e));
}

bool FieldErrors::Has(absl::string_view path) const {
  // Past the limit an error's path is not kept: any field may be wrong.
  return dropped_ > 0 || std::any_of(errors_.begin(), errors_.end(),
                                     [path](const FieldError& e) { return e.path == path; });
}

void FieldErrors::AttachLines(const FieldLines& lines) {
  for (FieldError& e : errors_) {
    if (e.line > 0) continue;
    if (auto it = lines.find(e.path); it != lines.end()) e.line = it->second;
  }
}

absl::Status FieldErrors::ToStatus() const {
  if (errors_.empty()) return absl::OkStatus();
  std::string text = absl::StrJoin(errors_, "\n", [](std::string* out, const FieldError& e) {
    out->append(FormatFieldError(e));
  });
  if (dropped_ > 0) {
    absl::StrAppend(&text, "\nand ", dropped_, " more error", dropped_ == 1 ? "" : "s",
                    " (only the first ", kMaxFieldErrors, " are listed)");
  }
  return absl::InvalidArgumentError(text);
}

std::string FormatFieldError(const FieldError& e) {
  const size_t end = e.what.find('\n');
  const absl::string_view what = e.what;
  return absl::StrCat(e.path, e.path.empty() ? "" : ": ", what.substr(0, end),
                      Place(e.line, e.column), end == std::string::npos ? "" : what.substr(end));
}

std::vector<FieldError> ParseFieldErrors(absl::string_view text, int max_errors,
                                         int max_lines_per_error) {
  std::vector<FieldError> out;
  int continuation_lines = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripSuffix(line, "\r");
    if (absl::StartsWith(line, kIndent) && !out.empty()) {
      if (continuation_lines++ < max_lines_per_error) absl::StrAppend(&out.back().what, "\n", line);
      continue;
    }
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    if (static_cast<int>(out.size()) >= max_errors) break;
    FieldError e;
    StripPlace(line, e.line, e.column);
    if (const size_t end = PathEnd(line); end != absl::string_view::npos && end > 0) {
      e.path = std::string(line.substr(0, end));
      e.what = std::string(line.substr(end + 2));
    } else {
      e.what = std::string(line);
    }
    out.push_back(std::move(e));
    continuation_lines = 0;
  }
  return out;
}

}  // namespace tandem
