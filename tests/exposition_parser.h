// A strict parser of the Prometheus text exposition format 0.0.4 for tests: it rejects, with
// the line number, whatever a Prometheus server would reject or a well-behaved exporter would
// not write (a sample before its family's TYPE, a family split in two, a counter without
// _total, a duplicate series, a bad escape, histogram buckets that are not cumulative).
#ifndef TANDEM_TESTS_EXPOSITION_PARSER_H_
#define TANDEM_TESTS_EXPOSITION_PARSER_H_

#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::testing {

struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

struct MetricFamily {
  std::string name;
  std::string type;  // counter, gauge, histogram
  std::string help;
  std::vector<MetricSample> samples;
};

struct Exposition {
  std::map<std::string, MetricFamily> families;

  // The samples named `name` whose labels include `labels`.
  std::vector<MetricSample> Find(const std::string& name,
                                 const std::map<std::string, std::string>& labels = {}) const {
    std::vector<MetricSample> out;
    for (const auto& [_, family] : families) {
      for (const MetricSample& s : family.samples) {
        if (s.name != name) continue;
        bool match = true;
        for (const auto& [k, v] : labels) {
          auto it = s.labels.find(k);
          match = match && it != s.labels.end() && it->second == v;
        }
        if (match) out.push_back(s);
      }
    }
    return out;
  }
  // The value of the one sample Find gives; nullopt when there is none or several.
  std::optional<double> Value(const std::string& name,
                              const std::map<std::string, std::string>& labels = {}) const {
    std::vector<MetricSample> found = Find(name, labels);
    if (found.size() != 1) return std::nullopt;
    return found[0].value;
  }
};

namespace exposition_internal {

inline bool ParseValue(const std::string& text, double* out) {
  if (text == "+Inf") {
    *out = INFINITY;
  } else if (text == "-Inf") {
    *out = -INFINITY;
  } else if (text == "NaN") {
    *out = NAN;
  } else {
    return absl::SimpleAtod(text, out) && text != "inf" && text != "nan";
  }
  return true;
}

// Parses `{a="x",b="y"}` from `line` at `*pos` (just after the metric name).
inline absl::Status ParseLabels(const std::string& line, size_t* pos,
                                std::map<std::string, std::string>* labels) {
  static const std::regex kLabelName("[a-zA-Z_][a-zA-Z0-9_]*");
  size_t i = *pos + 1;
  while (i < line.size() && line[i] != '}') {
    const size_t eq = line.find('=', i);
    if (eq == std::string::npos) return absl::InvalidArgumentError("label without =");
    const std::string name = line.substr(i, eq - i);
    if (!std::regex_match(name, kLabelName) || absl::StartsWith(name, "__")) {
      return absl::InvalidArgumentError(absl::StrCat("bad label name '", name, "'"));
    }
    if (eq + 1 >= line.size() || line[eq + 1] != '"') {
      return absl::InvalidArgumentError("label value not quoted");
    }
    std::string value;
    size_t j = eq + 2;
    for (; j < line.size() && line[j] != '"'; ++j) {
      if (line[j] == '\\') {
        if (j + 1 >= line.size()) return absl::InvalidArgumentError("dangling backslash");
        const char e = line[++j];
        if (e == 'n') {
          value += '\n';
        } else if (e == '\\' || e == '"') {
          value += e;
        } else {
          return absl::InvalidArgumentError(absl::StrCat("bad escape \\", std::string(1, e)));
        }
      } else {
        value += line[j];
      }
    }
    if (j >= line.size()) return absl::InvalidArgumentError("unterminated label value");
    if (!labels->emplace(name, value).second) {
      return absl::InvalidArgumentError(absl::StrCat("label '", name, "' twice"));
    }
    i = j + 1;
    if (i < line.size() && line[i] == ',') ++i;
  }
  if (i >= line.size()) return absl::InvalidArgumentError("unterminated label set");
  *pos = i + 1;
  return absl::OkStatus();
}

}  // namespace exposition_internal

inline absl::StatusOr<Exposition> ParseExposition(const std::string& text) {
  using exposition_internal::ParseLabels;
  using exposition_internal::ParseValue;
  static const std::regex kMetricName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  Exposition out;
  if (!text.empty() && text.back() != '\n') {
    return absl::InvalidArgumentError("the exposition does not end with a newline");
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  std::string current;  // the family whose samples may follow
  std::set<std::string> closed;
  std::set<std::string> series;
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string& line = lines[n];
    auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("line ", n + 1, ": ", what, ": '", line, "'"));
    };
    if (line.empty()) return error("empty line");
    if (line[0] == '#') {
      std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 3));
      if (parts.size() < 3 || (parts[1] != "HELP" && parts[1] != "TYPE")) {
        continue;  // a comment
      }
      const std::string& name = parts[2];
      if (!std::regex_match(name, kMetricName)) return error("bad metric name");
      if (name != current) {
        if (closed.count(name)) return error("a family continues after another began");
        if (!current.empty()) closed.insert(current);
        current = name;
      }
      MetricFamily& f = out.families[name];
      f.name = name;
      const std::string rest = parts.size() > 3 ? parts[3] : "";
      if (parts[1] == "HELP") {
        if (!f.help.empty()) return error("HELP twice");
        if (rest.empty()) return error("empty HELP");
        f.help = rest;
      } else {
        if (!f.type.empty()) return error("TYPE twice");
        if (!f.samples.empty()) return error("TYPE after samples");
        if (rest != "counter" && rest != "gauge" && rest != "histogram" && rest != "summary" &&
            rest != "untyped") {
          return error("bad type");
        }
        if (rest == "counter" && !absl::EndsWith(name, "_total")) {
          return error("a counter's name must end in _total");
        }
        f.type = rest;
      }
      continue;
    }
    size_t pos = line.find_first_of("{ ");
    if (pos == std::string::npos) return error("no value");
    MetricSample s;
    s.name = line.substr(0, pos);
    if (!std::regex_match(s.name, kMetricName)) return error("bad metric name");
    if (line[pos] == '{') {
      if (absl::Status st = ParseLabels(line, &pos, &s.labels); !st.ok()) {
        return error(std::string(st.message()));
      }
    }
    if (pos >= line.size() || line[pos] != ' ') return error("no space before the value");
    std::vector<std::string> value_and_time = absl::StrSplit(line.substr(pos + 1), ' ');
    if (value_and_time.empty() || value_and_time.size() > 2 ||
        !ParseValue(value_and_time[0], &s.value)) {
      return error("bad value");
    }
    auto it = out.families.find(current);
    if (it == out.families.end() || it->second.type.empty()) {
      return error("a sample before its family's TYPE");
    }
    MetricFamily& f = it->second;
    bool belongs = s.name == f.name;
    if (f.type == "histogram") {
      belongs =
          s.name == f.name + "_bucket" || s.name == f.name + "_sum" || s.name == f.name + "_count";
      if (s.name == f.name + "_bucket" && !s.labels.count("le")) return error("bucket without le");
    }
    if (!belongs) return error(absl::StrCat("a sample outside its family ", f.name));
    std::string key = s.name;
    for (const auto& [k, v] : s.labels) absl::StrAppend(&key, "|", k, "=", v);
    if (!series.insert(key).second) return error("a series twice");
    f.samples.push_back(std::move(s));
  }
  // Histograms: cumulative buckets ending in +Inf equal to _count.
  for (const auto& [name, f] : out.families) {
    if (f.type.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no TYPE"));
    if (f.help.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no HELP"));
    if (f.type != "histogram") continue;
    std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // by other labels
    std::map<std::string, double> counts;
    for (const MetricSample& s : f.samples) {
      std::string key;
      for (const auto& [k, v] : s.labels) {
        if (k != "le") absl::StrAppend(&key, k, "=", v, ",");
      }
      if (s.name == name + "_bucket") {
        double le = 0;
        if (!ParseValue(s.labels.at("le"), &le)) {
          return absl::InvalidArgumentError(absl::StrCat(name, ": bad le"));
        }
        buckets[key].emplace_back(le, s.value);
      } else if (s.name == name + "_count") {
        counts[key] = s.value;
      }
    }
    for (const auto& [key, b] : buckets) {
      for (size_t i = 1; i < b.size(); ++i) {
        if (b[i].first <= b[i - 1].first || b[i].second < b[i - 1].second) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, "{", key, "}: buckets not cumulative"));
        }
      }
      if (b.empty() || !std::isinf(b.back().first) || !counts.count(key) ||
          counts[key] != b.back().second) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "{", key, "}: the +Inf bucket is missing or differs from _count"));
      }
    }
  }
  return out;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_EXPOSITION_PARSER_H_
