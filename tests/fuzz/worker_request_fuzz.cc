// libFuzzer target: a worker's request handling. The input is a sequence of records, each
//   [kind: 1 byte][length: 2 bytes, little-endian][payload: `length` bytes]
// whose payload is parsed as the request message the kind names (as the gRPC adapter receives
// it) and handed, in order, to one StageManager, the worker's business logic behind
// StageWorkerService: Configure, RunStep (train or eval), ApplyStep, SaveCheckpoint, Abort,
// GetStatus. A payload that does not parse is dropped, as gRPC would refuse it. Any crash,
// hang, leak or sanitizer report is a bug: a daemon must answer bad input with a status.
//
// To stay fast, the harness gives the manager 16 MiB of memory and skips (as valid but
// expensive, not as errors) programs over a small work budget; multi-rank programs get a
// transport factory that fails, and a restore gets tensors of the wrong sizes.
//
// Seeds (tests/fuzz/corpus/worker_request_fuzz/) are written by
//   TANDEM_FUZZ_WRITE_SEEDS=DIR build-fuzz/tests/fuzz/worker_request_fuzz
#include <cblas.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/pipeline_plan.h"
#include "common/spec.h"
#include "common/version.h"
#include "tandem/v1/worker.pb.h"
#include "worker/stage_manager.h"

namespace tw = tandem::worker;
namespace v1 = tandem::v1;

namespace {

enum Kind : uint8_t {
  kConfigure = 0,
  kRunStep = 1,
  kApplyStep = 2,
  kSaveCheckpoint = 3,
  kAbort = 4,
  kGetStatus = 5,
  kNumKinds = 6,
};

std::string g_data_root;
bool g_verbose = false;  // TANDEM_FUZZ_VERBOSE=1: print every call's status (to check seeds)

void Log(const char* op, const absl::Status& s) {
  if (g_verbose) std::fprintf(stderr, "  %s: %s\n", op, s.ToString().c_str());
}

// Valid programs whose steps would take long are skipped: the budget is about work, not
// correctness (the worker's own limits are what is fuzzed below it).
bool TooExpensive(const v1::StageProgram& p) {
  const v1::JobSpec& s = p.spec();
  const v1::ModelSpec& m = s.model();
  const bool gpt = tandem::IsDecoder(m);
  const int64_t rows =
      int64_t{s.pipeline().micro_batch_size()} * (gpt ? int64_t{m.seq_len()} : int64_t{1});
  return s.data().synthetic_bytes() > (1 << 16) || m.d_model() > 64 || m.d_hidden() > 256 ||
         m.n_layer() > 6 || m.vocab_size() > 512 ||
         (gpt ? m.seq_len() > 32 || m.n_head() > 8 || m.n_kv_head() > 8
              : m.d_embed() > 64 || m.context() > 16) ||
         s.pipeline().micro_batch_size() > 16 || rows > 256 || p.micro_batches() > 8 ||
         s.pipeline().micro_batches() > 8 || p.eval_micro_batches() > 8 || p.actions_size() > 256 ||
         p.eval_actions_size() > 256 || p.chunks_size() > 8;
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "worker_request_fuzz: %s\n", what);
    std::abort();
  }
}

// A tiny job: mlp_lm, gpt or llama of 1-2 blocks at width 8.
v1::JobSpec TinySpec(const std::string& arch) {
  v1::JobSpec spec;
  spec.set_seed(7);
  auto* m = spec.mutable_model();
  if (arch == "gpt" || arch == "llama") {
    m->set_arch(arch);
    m->set_n_layer(1);
    m->set_n_head(2);
    m->set_d_model(8);
    m->set_seq_len(4);
    if (arch == "llama") {
      m->set_n_kv_head(1);
      m->set_d_hidden(16);
      m->set_tie_embeddings(false);
    }
  } else {
    m->set_arch("mlp_lm");
    m->set_n_layer(2);
    m->set_d_model(8);
    m->set_d_embed(4);
    m->set_context(2);
  }
  m->set_vocab_size(256);
  spec.mutable_data()->set_source("synthetic");
  spec.mutable_data()->set_synthetic_bytes(4096);
  auto* p = spec.mutable_pipeline();
  p->set_stages(1);
  p->set_micro_batch_size(2);
  p->set_micro_batches(2);
  p->set_schedule("gpipe");
  p->set_partition("uniform");
  return spec;
}

void Append(std::string* out, Kind kind, const google::protobuf::Message& msg) {
  const std::string payload = msg.SerializeAsString();
  out->push_back(static_cast<char>(kind));
  out->push_back(static_cast<char>(payload.size() & 0xff));
  out->push_back(static_cast<char>((payload.size() >> 8) & 0xff));
  out->append(payload);
}

// A whole session: configure, steps with their applies, an evaluation, a checkpoint, abort.
std::string Session(const v1::JobSpec& spec, bool eval, bool file_data) {
  v1::JobSpec s = spec;
  if (eval) s.mutable_eval()->set_every(1);
  if (file_data) {
    s.mutable_data()->set_source("file");
    s.mutable_data()->set_path("train.txt");
  }
  absl::StatusOr<tandem::PipelinePlan> plan = tandem::PlanPipeline(s);
  if (!plan.ok()) {
    std::fprintf(stderr, "seed plan: %s\n", plan.status().ToString().c_str());
    std::abort();
  }
  std::string out;
  v1::ConfigureRequest configure;
  configure.set_protocol_version(tandem::kProtocolVersion);
  *configure.mutable_program() = tandem::StageProgramFor(*plan, s, 0, "job-1", "job-1/");
  Append(&out, kConfigure, configure);
  for (int step = 0; step < 2; ++step) {
    v1::RunStepRequest run;
    run.set_protocol_version(tandem::kProtocolVersion);
    run.set_job_id("job-1");
    run.set_step(step);
    Append(&out, kRunStep, run);
    v1::ApplyStepRequest apply;
    apply.set_protocol_version(tandem::kProtocolVersion);
    apply.set_job_id("job-1");
    apply.set_step(step);
    apply.set_learning_rate(0.01f);
    apply.set_grad_scale(1.0f);
    Append(&out, kApplyStep, apply);
  }
  if (eval) {
    v1::RunStepRequest run;
    run.set_protocol_version(tandem::kProtocolVersion);
    run.set_job_id("job-1");
    run.set_step(1);
    run.set_mode(v1::STEP_MODE_EVAL);
    Append(&out, kRunStep, run);
  }
  v1::SaveCheckpointRequest save;
  save.set_protocol_version(tandem::kProtocolVersion);
  save.set_job_id("job-1");
  save.set_step(1);
  Append(&out, kSaveCheckpoint, save);
  Append(&out, kGetStatus, v1::GetStatusRequest());
  v1::AbortRequest abort;
  abort.set_protocol_version(tandem::kProtocolVersion);
  abort.set_job_id("job-1");
  Append(&out, kAbort, abort);
  return out;
}

void WriteSeeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  struct Seed {
    const char* name;
    std::string bytes;
  };
  std::vector<Seed> seeds = {
      {"mlp_lm_session", Session(TinySpec("mlp_lm"), false, false)},
      {"mlp_lm_eval_session", Session(TinySpec("mlp_lm"), true, false)},
      {"gpt_session", Session(TinySpec("gpt"), false, false)},
      {"gpt_file_data_session", Session(TinySpec("gpt"), true, true)},
      {"llama_session", Session(TinySpec("llama"), false, false)},
  };
  v1::JobSpec restore = TinySpec("mlp_lm");
  std::string resumed = Session(restore, false, false);
  {
    // A resume: the same program with a checkpoint to restore.
    absl::StatusOr<tandem::PipelinePlan> plan = tandem::PlanPipeline(restore);
    v1::ConfigureRequest c;
    c.set_protocol_version(tandem::kProtocolVersion);
    *c.mutable_program() = tandem::StageProgramFor(*plan, restore, 0, "job-2", "job-2/");
    c.mutable_program()->mutable_restore()->set_job_id("job-1");
    c.mutable_program()->mutable_restore()->set_step(1);
    std::string s;
    Append(&s, kConfigure, c);
    seeds.push_back({"restore", s});
  }
  {
    // Two ranks: the transport cannot connect.
    v1::JobSpec two = TinySpec("mlp_lm");
    two.mutable_pipeline()->set_stages(2);
    absl::StatusOr<tandem::PipelinePlan> plan = tandem::PlanPipeline(two);
    v1::ConfigureRequest c;
    c.set_protocol_version(tandem::kProtocolVersion);
    *c.mutable_program() = tandem::StageProgramFor(*plan, two, 1, "job-3", "job-3/");
    std::string s;
    Append(&s, kConfigure, c);
    seeds.push_back({"two_ranks", s});
  }
  for (const Seed& s : seeds) {
    std::ofstream(std::filesystem::path(dir) / s.name, std::ios::binary) << s.bytes;
  }
  std::fprintf(stderr, "wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  openblas_set_num_threads(1);
  spdlog::set_level(spdlog::level::off);
  // A data root with one small text file, a directory and a symlink that leads out of it.
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("tandem-fuzz-data-" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "shards");
  {
    std::ofstream text(root / "train.txt");
    for (int i = 0; i < 200; ++i) text << "the quick brown fox jumps over the lazy dog. ";
  }
  std::ofstream(root / "shards" / "a.bin", std::ios::binary) << std::string(512, '\x01');
  std::error_code ec;
  std::filesystem::create_symlink("/etc/hostname", root / "escape.txt", ec);
  g_data_root = root.string();
  // The data root goes with the process (every run, the test's included, made a new one).
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(g_data_root, ignored);
  });
  g_verbose = std::getenv("TANDEM_FUZZ_VERBOSE") != nullptr;
  if (const char* dir = std::getenv("TANDEM_FUZZ_WRITE_SEEDS"); dir != nullptr && *dir) {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tw::WorkerConfig config;
  config.data_root = g_data_root;
  config.memory_bytes = 16 << 20;
  tw::TransportFactory no_transport =
      [](const v1::StageProgram&,
         const std::atomic<bool>&) -> absl::StatusOr<std::unique_ptr<tw::Transport>> {
    return absl::UnavailableError("fuzz: no transport");
  };
  tw::TensorSource wrong_sizes = [](const v1::CheckpointRef&, const std::vector<std::string>& names,
                                    std::map<std::string, std::string>* out) {
    for (size_t i = 0; i < names.size(); ++i) (*out)[names[i]] = std::string(i % 3 * 4, '\0');
    return absl::OkStatus();
  };
  tw::StageManager manager(config, no_transport, wrong_sizes);
  size_t pos = 0;
  int ops = 0;
  while (pos + 3 <= size && ops++ < 32) {
    const uint8_t kind = data[pos] % kNumKinds;
    const size_t length =
        std::min<size_t>(data[pos + 1] | (size_t{data[pos + 2]} << 8), size - pos - 3);
    const uint8_t* payload = data + pos + 3;
    pos += 3 + length;
    switch (kind) {
      case kConfigure: {
        v1::ConfigureRequest req;
        if (!req.ParseFromArray(payload, static_cast<int>(length))) break;
        if (TooExpensive(req.program())) break;
        absl::StatusOr<v1::ConfigureResponse> r = manager.Configure(req.program());
        Log("Configure", r.status());
        Check(r.ok() || !r.status().message().empty(), "Configure failed without a message");
        break;
      }
      case kRunStep: {
        v1::RunStepRequest req;
        if (!req.ParseFromArray(payload, static_cast<int>(length))) break;
        absl::StatusOr<v1::StepReport> r =
            manager.RunStep(req.job_id(), req.step(), req.mode(), req.attempt());
        Log("RunStep", r.status());
        Check(r.ok() || !r.status().message().empty(), "RunStep failed without a message");
        break;
      }
      case kApplyStep: {
        v1::ApplyStepRequest req;
        if (!req.ParseFromArray(payload, static_cast<int>(length))) break;
        Log("ApplyStep", manager.ApplyStep(req));
        break;
      }
      case kSaveCheckpoint: {
        v1::SaveCheckpointRequest req;
        if (!req.ParseFromArray(payload, static_cast<int>(length))) break;
        absl::Status saved = manager.SaveCheckpoint(
            req.job_id(), req.step(),
            [](const std::vector<tw::StageExecutor::StateTensor>& tensors) {
              // Touch every byte, as the adapter streams them.
              volatile uint8_t sum = 0;
              for (const auto& t : tensors) {
                const auto* p = static_cast<const uint8_t*>(t.data);
                for (size_t i = 0; i < t.bytes; ++i) sum = sum + p[i];
              }
              return absl::OkStatus();
            },
            req.attempt());
        Log("SaveCheckpoint", saved);
        break;
      }
      case kAbort: {
        v1::AbortRequest req;
        if (!req.ParseFromArray(payload, static_cast<int>(length))) break;
        Log("Abort", manager.Abort(req.job_id(), req.reason()));
        break;
      }
      case kGetStatus:
        (void)manager.GetStatus();
        (void)manager.GetSnapshot();
        break;
    }
  }
  manager.Shutdown();
  return 0;
}
