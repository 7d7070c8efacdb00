#include "coordinator/cli/commands.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/field_errors.h"
#include "common/format_bytes.h"
#include "common/model_desc.h"
#include "common/partitioner.h"
#include "common/pipeline_plan.h"
#include "common/planner.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/step_number.h"
#include "common/version.h"
#include "coordinator/cli/format.h"
#include "coordinator/cli/plan.h"
#include "coordinator/hf_config.h"

namespace tandem::cli {
namespace {

// Text from the coordinator as one line: line breaks and other control characters (a
// terminal's escape sequences) become spaces. Its messages are not trusted to be one line.
std::string OneLine(absl::string_view text) {
  std::string out(text);
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = ' ';
  }
  return out;
}

// Turns a failed call into the one line the user sees.
absl::Status RpcError(Command command, const CliOptions& opts, const absl::Status& s) {
  const bool tls = !opts.tls_ca.empty();
  if (s.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach coordinator at ", opts.coordinator, ": ", OneLine(s.message()),
        tls ? " (with TLS, check that --tls-ca signs the coordinator's certificate and that the "
              "certificate names the host dialled, or give --tls-server-name)"
            : " (if the coordinator serves TLS, give --tls-ca FILE)"));
  }
  std::string hint;
  if (s.code() == absl::StatusCode::kDeadlineExceeded && command != Command::kWatch) {
    hint = absl::StrCat(" (no answer from ", opts.coordinator, " within ",
                        absl::FormatDuration(opts.timeout), "; raise --timeout)");
  } else if (s.code() == absl::StatusCode::kUnauthenticated) {
    hint = tls ? " (authenticate with --token-file FILE or $TANDEM_TOKEN, or with a client "
                 "certificate: --tls-cert FILE --tls-key FILE)"
               : " (the coordinator requires TLS and credentials: --tls-ca FILE, and "
                 "--token-file FILE or --tls-cert FILE --tls-key FILE)";
  } else if (s.code() == absl::StatusCode::kPermissionDenied) {
    hint =
        " (the client API takes a certificate with CN=tandem-client or the coordinator's "
        "bearer token)";
  }
  return absl::Status(
      s.code(), absl::StrCat(CommandName(command), ": ", absl::StatusCodeToString(s.code()), ": ",
                             OneLine(s.message()), hint));
}

// The name of a job file in errors; "-" is the standard input.
std::string FileName(const std::string& path) { return path == "-" ? "<stdin>" : path; }

// A spec's errors, in the text form of common/field_errors.h (from this process or from the
// coordinator), restated for the file they are about as compilers print them, one per line:
// "FILE:LINE: path: what", "FILE:LINE:COLUMN: path: what" where the text gives a column (a
// parse error), "FILE: path: what" for a field the file does not write (a default). The line
// of an error comes from the text when `text_lines_are_the_files` (what was checked is the
// file's own text), else from `lines`, where the file writes each field. The first line starts
// with `prefix`; the code and payloads of `s` are kept. Every line is made single-line here,
// for the text may come from the network, and at most kMaxFieldErrors + 1 are read.
absl::Status InFile(const absl::Status& s, absl::string_view prefix, const std::string& path,
                    const FieldLines& lines, bool text_lines_are_the_files) {
  const std::string file = FileName(path);
  std::vector<std::string> out;
  for (const FieldError& e : ParseFieldErrors(s.message(), kMaxFieldErrors + 1)) {
    int line = text_lines_are_the_files ? e.line : 0;
    int column = text_lines_are_the_files ? e.column : 0;
    if (line == 0) {
      if (auto it = lines.find(e.path); it != lines.end()) line = it->second;
    }
    const std::vector<absl::string_view> what = absl::StrSplit(e.what, '\n');
    std::string text = absl::StrCat(file, line > 0 ? absl::StrCat(":", line) : "",
                                    column > 0 ? absl::StrCat(":", column) : "", ": ",
                                    OneLine(e.path), e.path.empty() ? "" : ": ", OneLine(what[0]));
    for (size_t i = 1; i < what.size(); ++i) absl::StrAppend(&text, "\n", OneLine(what[i]));
    out.push_back(std::move(text));
  }
  if (out.empty()) out.push_back(absl::StrCat(file, ": ", OneLine(s.message())));
  absl::Status restated(s.code(), absl::StrCat(prefix, absl::StrJoin(out, "\n")));
  s.ForEachPayload([&restated](absl::string_view url, const absl::Cord& payload) {
    restated.SetPayload(url, payload);
  });
  return restated;
}

// The command line's overrides replace these fields: an error about them is not about the
// line of the file that wrote them.
void ForgetOverridden(const CliOptions& opts, FieldLines& lines) {
  if (!opts.schedule.empty() || !opts.schedule_csv.empty()) {
    lines.erase("pipeline.schedule");
    lines.erase("pipeline.schedule_csv");
  }
  if (opts.chunks >= 0) lines.erase("pipeline.chunks");
  if (opts.auto_plan) lines.erase("pipeline.plan");
}

bool HasOverrides(const CliOptions& opts) {
  return !opts.schedule.empty() || !opts.schedule_csv.empty() || opts.chunks >= 0 || opts.auto_plan;
}

absl::Status PrintJson(const google::protobuf::Message& message, std::ostream& out) {
  ASSIGN_OR_RETURN(const std::string json, ToJson(message, /*pretty=*/true));
  out << json << "\n";
  return absl::OkStatus();
}

absl::Status Watch(const CliOptions& opts, CoordinatorClient& client, const std::string& job_id,
                   CommandIo io) {
  WatchPrinter printer(io.out, opts.output, io.live);
  absl::Status print_error;
  int events = 0;
  absl::Status s = client.WatchJob(job_id, [&](const v1::JobEvent& event) {
    ++events;
    print_error = printer.OnEvent(event);
    return print_error.ok() && !IsTerminal(printer.state());
  });
  printer.Finish();
  RETURN_IF_ERROR(print_error);
  if (!s.ok()) {
    if (events > 0 &&
        (s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled)) {
      return absl::UnavailableError(absl::StrCat("watch: lost the coordinator at ",
                                                 opts.coordinator, " while following job ", job_id,
                                                 ": ", OneLine(s.message())));
    }
    return RpcError(Command::kWatch, opts, s);
  }
  const std::string reason =
      printer.reason().empty() ? "no reason given" : OneLine(printer.reason());
  switch (printer.state()) {
    case v1::SUCCEEDED:
      return absl::OkStatus();
    case v1::FAILED:
      return absl::AbortedError(absl::StrCat("job ", job_id, " FAILED: ", reason));
    case v1::CANCELLED:
      return absl::AbortedError(absl::StrCat("job ", job_id, " was CANCELLED: ", reason));
    default:
      return absl::UnavailableError(absl::StrCat(
          "watch: the coordinator at ", opts.coordinator, " ended the stream while job ", job_id,
          " was ", v1::JobState_Name(printer.state()), "; run 'tandem watch ", job_id,
          "' again to resume"));
  }
}

absl::Status Submit(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  const std::string& path = opts.args[0];
  std::string yaml;
  if (path == "-") {
    std::stringstream text;
    text << io.in.rdbuf();
    yaml = text.str();
  } else {
    absl::StatusOr<std::string> file = ReadJobFile(path);
    RETURN_IF_ERROR(WithPrefix(file.status(), "submit"));
    yaml = *std::move(file);
  }
  // The coordinator parses and validates; its INVALID_ARGUMENT lists the spec's errors, which
  // are restated for the file, each on the line of its field.
  std::string sent = yaml;
  if (HasOverrides(opts)) {
    // Overrides: parse here, apply them, and submit the result as JSON (JSON is YAML).
    FieldLines lines;
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml, &lines);
    if (!spec.ok()) return InFile(spec.status(), "submit: ", path, lines, true);
    RETURN_IF_ERROR(WithPrefix(ApplyScheduleOverrides(opts, *spec), "submit"));
    ASSIGN_OR_RETURN(sent, ToJson(*spec, /*pretty=*/false));
  }
  absl::StatusOr<std::string> job_id = client.SubmitJob(sent);
  if (job_id.status().code() == absl::StatusCode::kInvalidArgument) {
    FieldLines lines;
    (void)ParseJobSpecYaml(yaml, &lines);  // where each field is written, even if it is wrong
    ForgetOverridden(opts, lines);
    return InFile(job_id.status(), "submit: INVALID_ARGUMENT: ", path, lines,
                  /*text_lines_are_the_files=*/!HasOverrides(opts));
  }
  if (!job_id.ok()) return RpcError(Command::kSubmit, opts, job_id.status());
  if (opts.output == OutputFormat::kJson) {
    v1::SubmitJobResponse resp;
    resp.set_job_id(*job_id);
    ASSIGN_OR_RETURN(const std::string json, ToJson(resp, /*pretty=*/false));
    io.out << json << "\n";
  } else {
    io.out << *job_id << "\n";
  }
  io.out.flush();
  if (!opts.watch) return absl::OkStatus();
  return Watch(opts, client, *job_id, io);
}

absl::Status StatusAll(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  absl::StatusOr<v1::ListJobsResponse> jobs = client.ListJobs();
  if (!jobs.ok()) return RpcError(Command::kStatus, opts, jobs.status());
  absl::StatusOr<v1::ListWorkersResponse> workers = client.ListWorkers();
  if (!workers.ok()) return RpcError(Command::kStatus, opts, workers.status());
  if (opts.output == OutputFormat::kJson) {
    ASSIGN_OR_RETURN(const std::string a, ToJson(*jobs, /*pretty=*/true));
    ASSIGN_OR_RETURN(const std::string b, ToJson(*workers, /*pretty=*/true));
    ASSIGN_OR_RETURN(const std::string merged, MergeJsonObjects(a, b));
    io.out << merged << "\n";
    return absl::OkStatus();
  }
  if (jobs->jobs_size() == 0) {
    io.out << "No jobs. Submit one with 'tandem submit JOB.yaml'.\n";
  } else {
    io.out << FormatJobsTable(*jobs);
  }
  io.out << "\n" << FormatWorkersSummary(*workers) << "\n";
  return absl::OkStatus();
}

absl::Status StatusOne(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  // The table lists the recent steps only; JSON is the whole job.
  const uint32_t history = opts.output == OutputFormat::kJson ? 0 : kRecentSteps;
  absl::StatusOr<v1::Job> job = client.GetJob(opts.args[0], history);
  if (!job.ok()) return RpcError(Command::kStatus, opts, job.status());
  if (opts.output == OutputFormat::kJson) return PrintJson(*job, io.out);
  io.out << FormatJobDetails(*job);
  return absl::OkStatus();
}

absl::Status List(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  absl::StatusOr<v1::ListJobsResponse> jobs = client.ListJobs();
  if (!jobs.ok()) return RpcError(Command::kList, opts, jobs.status());
  if (opts.output == OutputFormat::kJson) return PrintJson(*jobs, io.out);
  if (jobs->jobs_size() == 0) {
    io.out << "No jobs.\n";
  } else {
    io.out << FormatJobsTable(*jobs);
  }
  return absl::OkStatus();
}

absl::Status Cancel(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  absl::StatusOr<v1::Job> job = client.CancelJob(opts.args[0]);
  if (!job.ok()) return RpcError(Command::kCancel, opts, job.status());
  if (opts.output == OutputFormat::kJson) return PrintJson(*job, io.out);
  v1::JobEvent event;
  event.set_job_id(job->id().empty() ? opts.args[0] : job->id());
  event.set_state(job->state());
  event.set_reason(job->reason());
  io.out << FormatStateLine(event, job->name()) << "\n";
  return absl::OkStatus();
}

absl::Status Workers(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  if (!opts.args.empty()) {
    absl::StatusOr<v1::WorkerInfo> w = client.GetWorker(opts.args[0]);
    if (!w.ok()) return RpcError(Command::kWorkers, opts, w.status());
    if (opts.output == OutputFormat::kJson) return PrintJson(*w, io.out);
    io.out << FormatWorkerDetails(*w);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::ListWorkersResponse> workers = client.ListWorkers();
  if (!workers.ok()) return RpcError(Command::kWorkers, opts, workers.status());
  if (opts.output == OutputFormat::kJson) return PrintJson(*workers, io.out);
  if (workers->workers_size() == 0) {
    io.out << "No workers registered. Start one with 'tandem-worker --coordinator "
           << opts.coordinator << "'.\n";
  } else {
    io.out << FormatWorkersTable(*workers);
  }
  return absl::OkStatus();
}

// Reads, parses and applies the command line's schedule overrides, then fills the defaults
// and validates: what `validate` and `plan` check.
absl::StatusOr<v1::JobSpec> LoadJobFile(const CliOptions& opts) {
  const std::string& path = opts.args[0];
  const std::string cmd(CommandName(opts.command));
  absl::StatusOr<std::string> yaml = ReadJobFile(path);
  RETURN_IF_ERROR(WithPrefix(yaml.status(), cmd));
  FieldLines lines;
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(*yaml, &lines);
  if (spec.ok()) {
    RETURN_IF_ERROR(WithPrefix(ApplyScheduleOverrides(opts, *spec), cmd));
    ForgetOverridden(opts, lines);
    *spec = WithDefaults(*spec);
    if (absl::Status s = ValidateJobSpec(*spec, lines); !s.ok()) spec = s;
  }
  if (!spec.ok()) return InFile(spec.status(), absl::StrCat(cmd, ": "), path, lines, true);
  return spec;
}

// What optimizer.shard_state does for this job, in a sentence.
std::string ShardStateNote(const v1::JobSpec& spec) {
  const int r = std::max(1, spec.pipeline().replicas());
  if (ShardsOptimizerState(spec)) {
    return absl::StrCat("optimizer.shard_state: each of the ", r, " replicas keeps 1/", r,
                        " of the AdamW moments (ZeRO stage 1: gradients reduce-scattered, "
                        "parameters all-gathered after the update).");
  }
  if (r == 1) {
    return "optimizer.shard_state: accepted, and does nothing with 1 replica (no other "
           "replica to share the optimizer state with).";
  }
  return absl::StrCat("optimizer.shard_state: accepted, and does nothing with optimizer ",
                      spec.optimizer().name(), " (it keeps no state to shard).");
}

absl::Status Validate(const CliOptions& opts, CommandIo io) {
  const std::string& path = opts.args[0];
  ASSIGN_OR_RETURN(const v1::JobSpec spec, LoadJobFile(opts));
  // JSON is YAML: the output can be submitted as it is.
  if (opts.output == OutputFormat::kJson) return PrintJson(spec, io.out);
  const v1::PipelineSpec& p = spec.pipeline();
  const int gang = GangSize(spec);
  const std::string replicas =
      p.replicas() > 1 ? absl::StrCat(p.stages(), " stages x ", p.replicas(), " replicas, ") : "";
  io.out << absl::StrFormat(
      "%s: valid. Job %s: %d steps on %d %s worker%s (%s%s), effective batch %s%d x %d = %d "
      "sequences, ideal bubble %.1f%%.\n",
      path, spec.name(), spec.steps(), gang, spec.device(), gang == 1 ? "" : "s", replicas,
      p.schedule_csv().empty() ? p.schedule() : "csv",
      p.replicas() > 1 ? absl::StrCat(p.replicas(), " x ") : "", p.micro_batch_size(),
      p.micro_batches(), EffectiveBatch(spec), 100 * PredictedBubble(spec));
  const v1::ModelSpec& m = spec.model();
  io.out << absl::StrFormat(
      "Model: %s, %s parameters (%.1fM)%s.\n", m.arch(), WithThousands(ModelParameterCount(m)),
      static_cast<double>(ModelParameterCount(m)) / 1e6,
      m.tie_embeddings() && IsDecoder(m) ? "; the LM head shares the token embedding" : "");
  if (spec.optimizer().shard_state()) io.out << ShardStateNote(spec) << "\n";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadJobFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return absl::NotFoundError(
        absl::StrCat("cannot read job file '", path, "': ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read job file '", path, "': not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read job file '", path, "': ", std::strerror(err)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::string> MergeJsonObjects(const std::string& a, const std::string& b) {
  absl::string_view left = absl::StripAsciiWhitespace(a);
  absl::string_view right = absl::StripAsciiWhitespace(b);
  if (left.size() < 2 || left.front() != '{' || left.back() != '}' || right.size() < 2 ||
      right.front() != '{' || right.back() != '}') {
    return absl::InternalError("cannot merge JSON values that are not objects");
  }
  left.remove_suffix(1);
  right.remove_prefix(1);
  const bool left_empty = absl::StripAsciiWhitespace(left.substr(1)).empty();
  const bool right_empty = absl::StripAsciiWhitespace(right.substr(0, right.size() - 1)).empty();
  if (left_empty) return std::string(absl::StripAsciiWhitespace(b));
  if (right_empty) return std::string(absl::StripAsciiWhitespace(a));
  return absl::StrCat(absl::StripTrailingAsciiWhitespace(left), ",", right);
}

// Writes `text` to `path` through "<path>.tmp" and a rename: never a torn file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) {
      std::remove(tmp.c_str());
      return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

namespace {

// RESOURCE_EXHAUSTED, naming both figures, when the file system of `path` has fewer than
// `bytes` available to this user. A file system that cannot say is not refused (the writes
// then fail as they would).
absl::Status CheckFreeSpace(const std::string& path, int64_t bytes) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(path, ec).parent_path();
  if (ec) return absl::OkStatus();
  const std::filesystem::space_info space = std::filesystem::space(dir, ec);
  if (ec || space.available == static_cast<std::uintmax_t>(-1)) return absl::OkStatus();
  if (bytes <= 0 || static_cast<std::uintmax_t>(bytes) <= space.available) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("export: the model is ", FormatBytes(bytes), " and ", dir.string(), " has ",
                   FormatBytes(static_cast<int64_t>(space.available)),
                   " free; free some space or export elsewhere (-o FILE.safetensors)"));
}

}  // namespace

// The safetensors file, then config.json in its directory (coordinator/hf_config.h) from the
// job's model spec, so that from_pretrained(directory) loads an export named
// model.safetensors.
absl::Status Export(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  const std::string& path = opts.output_path;
  const std::string tmp = path + ".tmp";
  // The config is made first: a job the coordinator does not know fails here, and a model
  // without a Hugging Face counterpart is refused by the export itself.
  absl::StatusOr<v1::Job> job = client.GetJob(opts.args[0], /*history_limit=*/1);
  if (!job.ok()) return RpcError(Command::kExport, opts, job.status());
  const absl::StatusOr<std::string> config = coordinator::HfConfigJson(job->spec().model());
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return absl::FailedPreconditionError(absl::StrCat("export: cannot write ", tmp));
  int64_t written = 0, total = -1, step = -1;
  absl::Status local;  // this side's failure (the disk), which ends the stream
  absl::Status s = client.ExportModel(opts.args[0], [&](const v1::ExportChunk& c) {
    if (total < 0) {
      total = c.total_bytes();
      step = c.step();
      // The first chunk says how much follows: a disk that cannot hold it is refused now,
      // before gigabytes cross the network only to fail at their end.
      local = CheckFreeSpace(tmp, total);
      if (!local.ok()) return local;
    }
    out.write(c.data().data(), static_cast<std::streamsize>(c.data().size()));
    written += static_cast<int64_t>(c.data().size());
    if (!out) {
      local = absl::DataLossError(absl::StrCat("export: writing ", tmp, " failed after ", written,
                                               " of ", total, " bytes: ", std::strerror(errno)));
    }
    return local;
  });
  out.close();
  if (!local.ok()) {
    std::remove(tmp.c_str());
    return local;
  }
  if (s.ok() && written != total) {
    s = absl::DataLossError(
        absl::StrCat("export: received ", written, " of ", total, " bytes; try again"));
  }
  if (!s.ok()) {
    std::remove(tmp.c_str());
    return RpcError(Command::kExport, opts, s);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("export: cannot rename ", tmp, " to ", path));
  }
  io.out << "wrote " << path << " (" << written << " bytes, checkpoint after step " << step + 1
         << ")\n";
  if (config.ok()) {
    const std::string config_path = coordinator::HfConfigPath(path);
    RETURN_IF_ERROR(WithPrefix(WriteFileAtomically(config_path, *config), "export"));
    io.out << "wrote " << config_path << "\n";
  }
  return absl::OkStatus();
}

absl::Status Trace(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  v1::GetJobTraceRequest req;
  req.set_job_id(opts.args[0]);
  req.set_format(opts.svg ? v1::TRACE_FORMAT_SVG : v1::TRACE_FORMAT_JSON);
  // The flags take step numbers (from 1); the RPC takes indices.
  if (opts.trace_step >= 0) req.set_step(StepIndex(opts.trace_step));
  if (opts.trace_first >= 0) {
    req.set_first_step(StepIndex(opts.trace_first));
    req.set_last_step(StepIndex(opts.trace_last));
  }
  absl::StatusOr<v1::GetJobTraceResponse> trace = client.GetJobTrace(req);
  if (!trace.ok()) return RpcError(Command::kTrace, opts, trace.status());
  const std::string& path = opts.output_path;
  if (path == "-") {
    io.out << trace->content();
    return absl::OkStatus();
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << trace->content();
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::FailedPreconditionError(
          absl::StrCat("trace: cannot write ", tmp, ": ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("trace: cannot rename ", tmp, " to ", path));
  }
  const auto& steps = trace->steps();
  std::string shown;
  if (steps.size() == 1) {
    shown = absl::StrCat("step ", StepNumber(steps[0]));
  } else if (!steps.empty()) {
    shown = absl::StrCat(steps.size(), " steps, ", StepNumber(steps[0]), " to ",
                         StepNumber(steps[steps.size() - 1]));
  }
  io.out << "wrote " << path << " (" << opts.args[0] << " " << shown << ", "
         << trace->content().size() << " bytes)"
         << (opts.svg ? "" : "; open it at https://ui.perfetto.dev") << "\n";
  return absl::OkStatus();
}

absl::Status Plan(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, LoadJobFile(opts));
  if (opts.workers > 0) {
    // "How should I split N workers": the same global batch on N workers, shown first as the
    // factorization with the most stages that can run; the search tries every one.
    const int64_t global = EffectiveBatch(spec);
    v1::JobSpec on_n = spec;
    on_n.mutable_pipeline()->set_stages(opts.workers);
    on_n.mutable_pipeline()->set_replicas(1);
    on_n.mutable_pipeline()->set_micro_batches(
        static_cast<int>(global / on_n.pipeline().micro_batch_size()));
    on_n.mutable_pipeline()->clear_cuts();
    if (on_n.pipeline().partition() == "manual") on_n.mutable_pipeline()->set_partition("profile");
    const std::vector<std::pair<int, int>> ways = Factorizations(on_n);
    if (ways.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan --workers ", opts.workers, ": no stages x replicas of ", opts.workers,
          " workers can run this job (stages <= model.n_layer + 2 = ", NumLayers(spec.model()),
          ", replicas dividing the global batch of ", global, " sequences)"));
    }
    spec = WithFactorization(on_n, ways[0].first, ways[0].second);
    io.out << "Planning for " << opts.workers << " workers; shown first as " << ways[0].first
           << " stages x " << ways[0].second << " replicas.\n\n";
  }
  if (opts.output == OutputFormat::kJson) {
    // The planner's search as the coordinator runs it for pipeline.plan: auto, machine-readable
    // (what a script runs the top candidates from).
    if (opts.no_profile || opts.compare || opts.print_actions || !opts.csv_out.empty()) {
      return absl::InvalidArgumentError(
          "plan -o json prints the coordinator's planner search; it does not combine with "
          "--no-profile, --compare, --print-actions or --csv");
    }
    if (io.progress != nullptr) {
      *io.progress << "plan: searching every split of the global batch on the coordinator; a "
                      "micro-batch size it holds no recent profile for is measured first on "
                      "idle workers (minutes each)\n"
                   << std::flush;
    }
    absl::StatusOr<v1::PlanJobResponse> search = client.PlanJob(spec);
    if (!search.ok()) return RpcError(Command::kPlan, opts, search.status());
    return PrintJson(*search, io.out);
  }
  // The coordinator's measured layer profile for this shape, when it can give one.
  std::optional<v1::ModelProfile> profile;
  if (!opts.no_profile) {
    absl::StatusOr<v1::ModelProfile> p = client.ProfileModel(spec, /*refresh=*/false);
    if (p.ok()) {
      profile = *std::move(p);
    } else {
      io.out << "(no measured profile: " << RpcError(Command::kPlan, opts, p.status()).message()
             << "; predictions use unit costs"
             << (spec.pipeline().partition() == "profile"
                     ? ", and the cut shown balances parameter counts, not measured time"
                     : "")
             << ")\n\n";
    }
  }
  const v1::ModelProfile* measured = profile.has_value() ? &*profile : nullptr;
  if (opts.compare) {
    io.out << FormatScheduleComparison(spec, measured);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> text = FormatPlan(spec, opts.print_actions, measured);
  RETURN_IF_ERROR(WithPrefix(text.status(), "plan"));
  io.out << *text;
  if (measured != nullptr && !opts.no_search) {
    // Every split of the global batch, each with the coordinator's profile at its shape.
    const std::vector<PlanCandidate> candidates =
        SearchPlans(spec, [&](const v1::JobSpec& s) -> absl::StatusOr<v1::ModelProfile> {
          if (s.pipeline().micro_batch_size() == spec.pipeline().micro_batch_size()) {
            return *profile;
          }
          // A size the coordinator has no recent profile for is measured now: say so, and how
          // long it took, rather than sit silent for minutes.
          if (io.progress != nullptr) {
            *io.progress << "plan: the profile of micro-batch size "
                         << s.pipeline().micro_batch_size() << " (cached, or measured now)... "
                         << std::flush;
          }
          const absl::Time asked = absl::Now();
          absl::StatusOr<v1::ModelProfile> p = client.ProfileModel(s, /*refresh=*/false);
          if (io.progress != nullptr) {
            *io.progress << (p.ok() ? "ready" : "failed") << " in "
                         << absl::StrFormat("%.1f", absl::ToDoubleSeconds(absl::Now() - asked))
                         << " s\n"
                         << std::flush;
          }
          return p;
        });
    absl::StatusOr<PipelinePlan> written = PlanPipeline(spec, measured);
    io.out << "\n"
           << FormatPlannerSearch(spec, candidates,
                                  written.ok() ? written->predicted_step_seconds : 0.0);
  }
  if (!opts.csv_out.empty()) {
    ASSIGN_OR_RETURN(const PipelinePlan plan, PlanPipeline(spec, measured));
    std::ofstream f(opts.csv_out, std::ios::binary | std::ios::trunc);
    f << ProgramToCsv(plan.schedule.program);
    f.close();
    if (!f) {
      return absl::UnavailableError(
          absl::StrCat("plan: cannot write ", opts.csv_out, ": ", std::strerror(errno)));
    }
    io.out << "\nWrote the schedule (" << plan.num_ranks() << " rows, lowered) to " << opts.csv_out
           << "; run it with --schedule-csv " << opts.csv_out << ".\n";
  }
  return absl::OkStatus();
}

absl::Status RunCommand(const CliOptions& opts, CoordinatorClient& client, CommandIo io) {
  switch (opts.command) {
    case Command::kHelp: {
      Command about = Command::kHelp;
      if (!opts.args.empty()) {
        for (Command c : {Command::kSubmit, Command::kStatus, Command::kWatch, Command::kList,
                          Command::kCancel, Command::kWorkers, Command::kValidate, Command::kExport,
                          Command::kPlan, Command::kTrace, Command::kVersion}) {
          if (CommandName(c) == opts.args[0]) about = c;
        }
      }
      io.out << (about == Command::kHelp ? Usage() : CommandUsage(about));
      return absl::OkStatus();
    }
    case Command::kVersion:
      io.out << "tandem " << kVersion << " (protocol tandem.v1/" << kProtocolVersion << ")\n";
      return absl::OkStatus();
    case Command::kSubmit:
      return Submit(opts, client, io);
    case Command::kStatus:
      return opts.args.empty() ? StatusAll(opts, client, io) : StatusOne(opts, client, io);
    case Command::kWatch:
      return Watch(opts, client, opts.args[0], io);
    case Command::kList:
      return List(opts, client, io);
    case Command::kCancel:
      return Cancel(opts, client, io);
    case Command::kWorkers:
      return Workers(opts, client, io);
    case Command::kValidate:
      return Validate(opts, io);
    case Command::kExport:
      return Export(opts, client, io);
    case Command::kPlan:
      return Plan(opts, client, io);
    case Command::kTrace:
      return Trace(opts, client, io);
  }
  return absl::InternalError("unhandled command");
}

}  // namespace tandem::cli
