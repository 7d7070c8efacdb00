// Recovery from worker faults (issue 24's figures): the time from a worker's SIGKILL to the
// first step the job completes after it, the steps it trained again, and the goodput of a run
// with a kill every K steps (the fault-free run's time / the faulted run's), on 127.0.0.1 with
// the real coordinator and workers of the integration harness.
//
// Four ways back, each its own run after a fault-free reference of the same job:
//   peer:       2 stages x 2 replicas, a spare idle; each kill restarts the job on the spare
//               from the state the dead worker's surviving replica (and the others) kept after
//               the last completed step (peer recovery): only the step in flight runs again;
//   checkpoint: the same job and spare with --peer-recovery=false: each kill restarts it from
//               its latest checkpoint;
//   spare:      4 stages (no replica to take the state from), a spare idle: from the checkpoint;
//   elastic:    4 stages, elastic.min_workers 2 and no spare: each kill shrinks the job to the 3
//               workers left (from its checkpoint); a new worker registers at once, and the job
//               grows back to 4 at its next checkpoint (a voluntary restart that redoes nothing).
// In every mode a new worker process replaces the killed one, so that a spare is there for the
// next kill. The 2 x 2 and 4 x 1 jobs have the same global batch (8 micro-batches of 32).
//
//   build/bin/bench_elastic [--steps 200] [--kill-every 40] [--checkpoint-every 10]
//                           [--d-model 512] [--mode peer,checkpoint,spare,elastic]
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "tests/integration/harness.h"

namespace {

namespace v1 = tandem::v1;
using tandem::testing::Cluster;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Options {
  int steps = 200;
  int kill_every = 40;
  int checkpoint_every = 10;
  int d_model = 512;
  std::vector<std::string> modes = {"peer", "checkpoint", "spare", "elastic"};
};

// 4 stages, or (`replicas`) 2 stages x 2 replicas of half the micro-batches: one global batch.
std::string JobYaml(const Options& o, bool elastic, bool replicas) {
  return absl::StrCat(
      "name: recovery\nsteps: ", o.steps,
      "\nseed: 7\nmodel:\n  arch: mlp_lm\n  n_layer: 4\n  d_model: ", o.d_model,
      "\n  d_embed: 32\n  context: 8\noptimizer:\n  lr: 0.01\npipeline:\n",
      replicas ? "  stages: 2\n  replicas: 2\n  micro_batches: 4\n"
               : "  stages: 4\n  micro_batches: 8\n",
      "  micro_batch_size: 32\n  schedule: 1f1b\n  partition: uniform\n"
      "checkpoint:\n  every: ",
      o.checkpoint_every, "\n  keep: 2\nmax_restarts: ", o.steps, "\n",
      elastic ? "elastic:\n  min_workers: 2\n" : "");
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5))];
}

// The harness index of the worker at `address`, or -1.
int WorkerAt(Cluster& cluster, const std::string& address) {
  for (int i = 0; i < cluster.num_workers(); ++i) {
    std::string port;
    if (FILE* f = std::fopen(absl::StrCat(cluster.dir(), "/worker", i, ".port").c_str(), "r")) {
      char buf[32] = {0};
      if (std::fgets(buf, sizeof(buf), f) != nullptr) port = buf;
      std::fclose(f);
    }
    port = std::string(absl::StripAsciiWhitespace(port));
    if (!port.empty() && absl::EndsWith(address, ":" + port)) return i;
  }
  return -1;
}

// Polls the job (every 10 ms, at most `timeout`) until `done`.
template <typename Pred>
absl::StatusOr<v1::Job> Until(Cluster& cluster, const std::string& id, Pred done,
                              std::chrono::seconds timeout) {
  const auto until = Clock::now() + timeout;
  while (Clock::now() < until) {
    absl::StatusOr<v1::Job> job = cluster.GetJob(id);
    if (job.ok() && done(*job)) return job;
    std::this_thread::sleep_for(10ms);
  }
  return absl::DeadlineExceededError(absl::StrCat("waiting on ", id));
}

struct Run {
  double seconds = 0;  // RUNNING to SUCCEEDED
  std::vector<double> recovery;
  std::vector<int64_t> redone;
  int restarts = 0;
  int peer_recoveries = 0;
  int resizes = 0;
  std::vector<double> losses;
};

// One job to its end; with kill_every > 0, a worker of the job is killed every kill_every steps
// and a new worker process started in its place.
absl::StatusOr<Run> RunJob(Cluster& cluster, const Options& o, bool elastic, bool replicas,
                           bool kills) {
  ASSIGN_OR_RETURN(const std::string id, cluster.Submit(JobYaml(o, elastic, replicas)));
  ASSIGN_OR_RETURN(
      v1::Job job,
      Until(
          cluster, id,
          [](const v1::Job& j) { return j.state() == v1::RUNNING && j.steps_done() > 0; }, 600s));
  const Clock::time_point start = Clock::now();
  Run run;
  std::mt19937 rng(11);
  for (int at = o.kill_every; kills && at < o.steps; at += o.kill_every) {
    ASSIGN_OR_RETURN(job, Until(
                              cluster, id,
                              [&](const v1::Job& j) {
                                // (an elastic job is QUEUED for a moment when it grows)
                                return (j.steps_done() >= at && j.state() == v1::RUNNING) ||
                                       (j.state() == v1::SUCCEEDED || j.state() == v1::FAILED ||
                                        j.state() == v1::CANCELLED);
                              },
                              600s));
    if (job.state() != v1::RUNNING) break;
    const int before_restarts = job.restarts();
    const int64_t before_redone = job.steps_redone();
    std::vector<std::string> addresses;
    for (const v1::StageAssignment& s : job.stages()) {
      if (s.replicas_size() == 0) addresses.push_back(s.address());
      for (const auto& r : s.replicas()) addresses.push_back(r.address());
    }
    const int victim = WorkerAt(cluster, addresses[rng() % addresses.size()]);
    if (victim < 0) return absl::InternalError("no worker process at the stage's address");
    cluster.worker(victim).Kill(SIGKILL);
    const Clock::time_point killed = Clock::now();
    // Back to full capacity: a new worker process in the killed one's place.
    RETURN_IF_ERROR(cluster.AddWorker());
    // The restarted run's first completed step: steps_done moves past where it resumed (the
    // restart sets it there: the checkpoint's step, or the survivors').
    int64_t resumed = -1;
    ASSIGN_OR_RETURN(job, Until(
                              cluster, id,
                              [&](const v1::Job& j) {
                                if (j.restarts() <= before_restarts) return false;
                                if (resumed < 0) resumed = j.steps_done();
                                return j.state() == v1::RUNNING && j.steps_done() > resumed;
                              },
                              600s));
    run.recovery.push_back(Seconds(killed, Clock::now()));
    run.redone.push_back(job.steps_redone() - before_redone);
    std::fprintf(stderr,
                 "  kill at step %d: worker %d; back at step %lld after %.2f s, %lld redone\n", at,
                 victim, static_cast<long long>(job.steps_done()), run.recovery.back(),
                 static_cast<long long>(run.redone.back()));
  }
  ASSIGN_OR_RETURN(job, cluster.WaitForEnd(id, std::chrono::seconds(3600)));
  if (job.state() != v1::SUCCEEDED) {
    return absl::InternalError(
        absl::StrCat(id, " ended ", v1::JobState_Name(job.state()), ": ", job.reason()));
  }
  run.seconds = Seconds(start, Clock::now());
  run.restarts = job.restarts();
  run.peer_recoveries = job.peer_recoveries();
  run.resizes = job.resizes_size();
  for (const v1::StepSummary& s : job.history()) run.losses.push_back(s.loss());
  return run;
}

bool ParseFlags(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    int* target = flag == "--steps"              ? &o->steps
                  : flag == "--kill-every"       ? &o->kill_every
                  : flag == "--checkpoint-every" ? &o->checkpoint_every
                  : flag == "--d-model"          ? &o->d_model
                                                 : nullptr;
    if (flag == "--mode") {
      o->modes = absl::StrSplit(value, ',');
    } else if (target == nullptr || !absl::SimpleAtoi(value, target)) {
      return false;
    }
  }
  return (argc % 2) == 1 && o->steps > 0 && o->kill_every > 0 && o->checkpoint_every > 0 &&
         o->d_model > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseFlags(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s [--steps 200] [--kill-every 40] [--checkpoint-every 10] "
                 "[--d-model 512] [--mode peer,checkpoint,spare,elastic]\n",
                 argv[0]);
    return 2;
  }
  std::printf(
      "recovery from worker kills: mlp_lm d_model %d, 2 x 2 (peer, checkpoint) or 4 x 1 (spare, "
      "elastic) workers, %d steps, a checkpoint every %d, a kill every %d steps\n",
      o.d_model, o.steps, o.checkpoint_every, o.kill_every);
  std::printf("%-10s %9s %9s %8s %6s %10s %10s %7s %9s %5s %11s\n", "mode", "ref s", "run s",
              "goodput", "kills", "recov p50", "recov max", "redone", "restarts", "peer",
              "max |dloss|");
  for (const std::string& mode : o.modes) {
    const bool elastic = mode == "elastic";
    const bool replicas = mode == "peer" || mode == "checkpoint";
    if (!elastic && !replicas && mode != "spare") {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
    Cluster::Options options;
    options.workers = elastic ? 4 : 5;
    options.coordinator_args = {"--step-deadline-floor-ms=3000", "--restart-backoff-ms=100",
                                mode == "checkpoint" ? "--peer-recovery=false"
                                                     : "--peer-recovery=true"};
    Cluster cluster(options);
    if (absl::Status s = cluster.Start(); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    absl::StatusOr<Run> reference = RunJob(cluster, o, elastic, replicas, /*kills=*/false);
    absl::StatusOr<Run> faulted = reference.ok()
                                      ? RunJob(cluster, o, elastic, replicas, /*kills=*/true)
                                      : reference.status();
    if (!faulted.ok()) {
      std::fprintf(stderr, "%s: %s\n", mode.c_str(), faulted.status().ToString().c_str());
      return 1;
    }
    double max_diff = 0;
    for (size_t i = 0; i < faulted->losses.size() && i < reference->losses.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(faulted->losses[i] - reference->losses[i]) /
                                        std::max(1e-12, std::abs(reference->losses[i])));
    }
    int64_t redone = 0;
    for (int64_t r : faulted->redone) redone += r;
    std::printf("%-10s %9.2f %9.2f %8.3f %6zu %10.2f %10.2f %7lld %9d %5d %11.1e\n",
                mode.c_str(), reference->seconds, faulted->seconds,
                reference->seconds / faulted->seconds, faulted->recovery.size(),
                Percentile(faulted->recovery, 50), Percentile(faulted->recovery, 100),
                static_cast<long long>(redone), faulted->restarts, faulted->peer_recoveries,
                max_diff);
    std::fflush(stdout);
  }
  return 0;
}
