// What a log line is about: the job, the stage(s) and the step the thread is working on.
//
// Every daemon formats its spdlog lines with InstallLogFormat, which puts the calling thread's
// context on each line as `[job=J stage=S step=N]` ("-" where a field is not set), so that a
// line from any worker can be tied to the job, stage and step it came from (steps numbered from
// 1, common/step_number.h). Code that works for a job sets the context for a scope:
//
//   ScopedLogContext ctx({.job = job_id, .stage = "1", .step = step_index});
//
// Contexts nest: an inner scope overrides the fields it sets and inherits the others, and the
// outer context comes back when it ends. The context is thread-local; a thread started for a
// job sets its own.
#ifndef TANDEM_COMMON_LOG_CONTEXT_H_
#define TANDEM_COMMON_LOG_CONTEXT_H_

#include <cstdint>
#include <string>

namespace tandem {

struct LogContext {
  std::string job;    // empty: not set
  std::string stage;  // the stage, or stages ("0,2") of the thread's work; empty: not set
  int64_t step = -1;  // the step's 0-based index; -1: not set
};

// The calling thread's context.
const LogContext& CurrentLogContext();

// "job=J stage=S step=N", "-" for what is not set; the step as its number (index + 1).
std::string FormatLogContext(const LogContext& context);

class ScopedLogContext {
 public:
  // Sets the fields of `context` that are set; the others keep the enclosing scope's values.
  explicit ScopedLogContext(const LogContext& context);
  ~ScopedLogContext();
  ScopedLogContext(const ScopedLogContext&) = delete;
  ScopedLogContext& operator=(const ScopedLogContext&) = delete;

 private:
  LogContext saved_;
};

// Formats every spdlog line of this process as
//   [2026-12-01 16:00:00.123] [info] [job=J stage=S step=N] message
void InstallLogFormat();

}  // namespace tandem

#endif  // TANDEM_COMMON_LOG_CONTEXT_H_
