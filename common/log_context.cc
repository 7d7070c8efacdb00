#include "common/log_context.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/step_number.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

thread_local LogContext current;

// %J: the thread's log context.
class ContextFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string text = FormatLogContext(current);
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<ContextFlag>();
  }
};

}  // namespace

const LogContext& CurrentLogContext() { return current; }

std::string FormatLogContext(const LogContext& c) {
  return absl::StrCat("job=", c.job.empty() ? "-" : c.job,
                      " stage=", c.stage.empty() ? "-" : c.stage,
                      " step=", c.step < 0 ? std::string("-") : absl::StrCat(StepNumber(c.step)));
}

ScopedLogContext::ScopedLogContext(const LogContext& context) : saved_(current) {
  if (!context.job.empty()) current.job = context.job;
  if (!context.stage.empty()) current.stage = context.stage;
  if (context.step >= 0) current.step = context.step;
}

ScopedLogContext::~ScopedLogContext() { current = std::move(saved_); }

void InstallLogFormat() {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<ContextFlag>('J').set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] [%J] %v");
  spdlog::set_formatter(std::move(formatter));
}

}  // namespace tandem
