// A link cut between two workers, with real processes in network namespaces this test makes.
//
// The test process moves itself into a network namespace of its own (unshare, before any
// thread starts) and runs the coordinator there. Each worker runs in a namespace of its own,
// joined to the test's by a veth pair (the control network, 192.0.2.0/30 and 192.0.2.4/30),
// and the two workers are joined directly by one more veth pair (the data network,
// 198.51.100.0/30, the workers' --data-host): activations and gradients cross only that link,
// the coordinator's RPCs and heartbeats never do. Taking the data link down (ip link set d0
// down) leaves every heartbeat alive, so the fault is seen where it happens, in a step that
// cannot finish; the job must be aborted on both workers, wait, and train on once the link is
// back, with the losses of an uninterrupted run. Only documentation ranges inside these
// namespaces are used; everything is removed when the test ends.
//
// Needs root and network namespaces; skips (and says why) where either is missing. The
// namespaces are held by processes (unshare --net) and entered with nsenter --net, which
// touches no mounts: `ip netns` needs /run/netns and mount propagation, which a chroot lacks.
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr int kSteps = 200;

// Why the namespaced tests cannot run in this process; empty when they can.
std::string& SkipReason() {
  static std::string reason;
  return reason;
}

// The path of a system program, or "" when it is not installed.
std::string FindBinary(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    const std::string p = dir + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Runs `argv`; a failure names the command and what it printed.
absl::Status Run(const std::vector<std::string>& argv) {
  const CommandResult r = RunCommand(argv, 30s);
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(argv, " "), ": exit ", r.exit_code, ": ", r.err, r.out));
  }
  return absl::OkStatus();
}

// `ip ARGS...` in this process's namespace.
absl::Status Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv{FindBinary("ip")};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv);
}

std::string NetNamespaceOf(const std::string& pid) {
  char buf[128] = {};
  const std::string link = "/proc/" + pid + "/ns/net";
  const ssize_t n = readlink(link.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// A network namespace held by a process of its own (unshare --net sleep). Unlike `ip netns
// add` it needs no /run/netns mount, and entering it (nsenter --net) changes no mounts, so it
// also works in a chroot. The namespace, with its links, goes when the holder is killed.
class NetNamespace {
 public:
  static absl::StatusOr<std::unique_ptr<NetNamespace>> Make(const std::string& log_path) {
    auto ns = std::unique_ptr<NetNamespace>(new NetNamespace());
    ns->holder_ = std::make_unique<Process>(
        FindBinary("unshare"), std::vector<std::string>{"--net", FindBinary("sleep"), "100000"},
        log_path);
    ns->pid_ = std::to_string(ns->holder_->pid());
    const std::string own = NetNamespaceOf("self");
    if (!WaitFor(
            [&] {
              const std::string theirs = NetNamespaceOf(ns->pid_);
              return !theirs.empty() && theirs != own;
            },
            5s, 10ms)) {
      return absl::UnavailableError(
          absl::StrCat("unshare --net did not make a namespace: ", ReadFile(log_path)));
    }
    return ns;
  }
  const std::string& pid() const { return pid_; }
  // The prefix that runs a command inside.
  std::vector<std::string> Enter() const {
    return {FindBinary("nsenter"), "--net=/proc/" + pid_ + "/ns/net"};
  }
  // `ip ARGS...` inside.
  absl::Status Ip(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = Enter();
    argv.push_back(FindBinary("ip"));
    argv.insert(argv.end(), args.begin(), args.end());
    return Run(argv);
  }

 private:
  NetNamespace() = default;
  std::unique_ptr<Process> holder_;
  std::string pid_;
};

class LinkCutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!SkipReason().empty()) GTEST_SKIP() << SkipReason();
    for (int i = 0; i < 2; ++i) {
      auto ns = NetNamespace::Make(absl::StrCat(::testing::TempDir(), "/netns-", getpid(), "-", i));
      if (!ns.ok()) GTEST_SKIP() << "cannot create a network namespace here: " << ns.status();
      namespaces_.push_back(*std::move(ns));
    }
    // Control links: the test's namespace (the coordinator) to each worker's.
    const char* coordinator_ip[] = {"192.0.2.1", "192.0.2.5"};
    const char* worker_ip[] = {"192.0.2.2", "192.0.2.6"};
    for (int i = 0; i < 2; ++i) {
      const NetNamespace& ns = *namespaces_[i];
      const std::string host_end = absl::StrCat("c", i, "-", getpid() % 100000);
      absl::Status s =
          Ip({"link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns.pid()});
      if (s.ok()) s = Ip({"addr", "add", absl::StrCat(coordinator_ip[i], "/30"), "dev", host_end});
      if (s.ok()) s = Ip({"link", "set", host_end, "up"});
      if (s.ok()) s = ns.Ip({"addr", "add", absl::StrCat(worker_ip[i], "/30"), "dev", "eth0"});
      if (s.ok()) s = ns.Ip({"link", "set", "eth0", "up"});
      if (s.ok()) s = ns.Ip({"link", "set", "lo", "up"});
      ASSERT_TRUE(s.ok()) << s;
    }
    // The data link: worker a's d0 to worker b's d0.
    const NetNamespace& a = *namespaces_[0];
    const NetNamespace& b = *namespaces_[1];
    absl::Status s =
        a.Ip({"link", "add", "d0", "type", "veth", "peer", "name", "d0", "netns", b.pid()});
    if (s.ok()) s = a.Ip({"addr", "add", "198.51.100.1/30", "dev", "d0"});
    if (s.ok()) s = b.Ip({"addr", "add", "198.51.100.2/30", "dev", "d0"});
    if (s.ok()) s = a.Ip({"link", "set", "d0", "up"});
    if (s.ok()) s = b.Ip({"link", "set", "d0", "up"});
    ASSERT_TRUE(s.ok()) << s;

    Cluster::Options options;
    options.workers = 2;
    options.coordinator_listen_host = "0.0.0.0";
    options.coordinator_args = {"--step-deadline-floor-ms=2000", "--restart-backoff-ms=1000"};
    const std::vector<std::vector<std::string>> enter = {a.Enter(), b.Enter()};
    options.place_worker = [enter](int i) {
      Cluster::Options::Placement p;
      p.prefix = enter[i];
      p.coordinator_host = i == 0 ? "192.0.2.1" : "192.0.2.5";
      p.listen_host = i == 0 ? "192.0.2.2" : "192.0.2.6";
      p.args = {i == 0 ? "--data-host=198.51.100.1" : "--data-host=198.51.100.2"};
      return p;
    };
    cluster_ = std::make_unique<Cluster>(options);
    absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started;
  }

  void TearDown() override {
    if (HasFailure() && cluster_) {
      std::cerr << "coordinator log:\n" << ReadFile(cluster_->dir() + "/coordinator.log");
      for (int i = 0; i < cluster_->num_workers(); ++i) {
        std::cerr << "worker " << i << " log:\n" << ReadFile(cluster_->worker(i).log_path());
      }
    }
    cluster_.reset();     // the processes first,
    namespaces_.clear();  // then their namespaces (and every link in them)
  }

  // A 2-stage job that checkpoints every 10 steps.
  static std::string Job(int max_restarts) {
    return TinyJobYaml(
        2, 4, kSteps, "1f1b",
        absl::StrCat("checkpoint:\n  every: 10\n  keep: 2\nmax_restarts: ", max_restarts, "\n"));
  }

  absl::Status SetDataLink(bool up) {
    return namespaces_[0]->Ip({"link", "set", "d0", up ? "up" : "down"});
  }

  std::vector<std::unique_ptr<NetNamespace>> namespaces_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(LinkCutTest, ACutDataLinkIsDetectedAndTheJobRecoversOnceItIsBack) {
  auto ref_id = cluster_->Submit(Job(0));
  ASSERT_TRUE(ref_id.ok()) << ref_id.status();
  auto reference = cluster_->WaitForEnd(*ref_id, 120s);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->state(), v1::SUCCEEDED) << reference->reason();

  auto id = cluster_->Submit(Job(5));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->WaitForSteps(*id, 35));
  ASSERT_TRUE(SetDataLink(false).ok());
  absl::StatusOr<double> detected = cluster_->SecondsUntilRestart(*id, 20s);
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_LT(*detected, 10.0) << "a cut link is detected within 10 s";
  // Both workers still heartbeat: the job is not given up while the link is down, it waits
  // (restart backoff) and tries again.
  std::this_thread::sleep_for(3s);
  auto during = cluster_->GetJob(*id);
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_THAT(during->state(), AnyOf(v1::QUEUED, v1::RUNNING)) << during->reason();
  ASSERT_TRUE(SetDataLink(true).ok());

  auto end = cluster_->WaitForEnd(*id, 120s);
  ASSERT_TRUE(end.ok()) << end.status();
  ExpectTheReferenceRun(*end, *reference, kSteps);
  EXPECT_GE(end->restarts(), 1);
  // The step that could not finish passes its deadline: its worker still answers probes.
  EXPECT_THAT(end->first_failure(), HasSubstr("timed out: no answer within"));
  auto workers = cluster_->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const auto& w : *workers)
    EXPECT_NE(w.state(), v1::LOST)
        << w.worker_id() << ": its heartbeats never crossed the cut link";
}

}  // namespace
}  // namespace tandem::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Into a network namespace of this process's own before any thread starts: the coordinator
  // listens there, and the workers' namespaces are joined to it.
  std::string& reason = tandem::testing::SkipReason();
  if (geteuid() != 0) {
    reason = "needs root (network namespaces and veth links)";
  } else if (tandem::testing::FindBinary("ip").empty()) {
    reason = "ip (iproute2) is not installed";
  } else if (tandem::testing::FindBinary("unshare").empty() ||
             tandem::testing::FindBinary("nsenter").empty()) {
    reason = "unshare and nsenter (util-linux) are not installed";
  } else if (unshare(CLONE_NEWNET) != 0) {
    reason = absl::StrCat("cannot make a network namespace: unshare: ", strerror(errno));
  } else if (absl::Status s = tandem::testing::Ip({"link", "set", "lo", "up"}); !s.ok()) {
    reason = absl::StrCat("cannot bring up loopback in the new namespace: ", s.message());
  }
  return RUN_ALL_TESTS();
}
