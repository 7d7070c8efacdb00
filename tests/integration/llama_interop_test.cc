// Llama and Hugging Face, end to end with the real daemons and CLI: a llama job's loss on a
// fixed window equals what an independent numpy forward (tests/scripts/llama_reference.py,
// written from the published equations) computes from `tandem export`'s file and config.json;
// a job fine-tuned from that file starts at the same loss; and export -> import -> export
// gives the same bytes. Untied and tied embeddings.
//
// The job trains preset llama-tiny on a data file exactly seq_len + 1 bytes long, so that
// every sampled window is the same one, with a learning rate (1e-30) too small to move any
// weight: every step's loss is the loss of the initial (and exported) model on that window.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kSeqLen = 32;  // llama-tiny's

class LlamaInteropTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "needs python3 with numpy and safetensors (scripts/install-deps.sh --test)";
    }
    Cluster::Options options;
    options.workers = 2;
    cluster_ = std::make_unique<Cluster>(options);
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
    // One window of text: seq_len inputs and their next tokens.
    const std::string window = "Llama exports: RMSNorm, RoPE, GQA";
    ASSERT_EQ(window.size(), size_t{kSeqLen + 1});
    std::ofstream(cluster_->dir() + "/window.txt", std::ios::binary) << window;
  }
  void TearDown() override {
    if (HasFailure() && cluster_) {
      std::cerr << "coordinator log:\n" << ReadFile(cluster_->dir() + "/coordinator.log");
      for (int i = 0; i < cluster_->num_workers(); ++i) {
        std::cerr << "worker" << i << " log:\n"
                  << ReadFile(cluster_->dir() + "/worker" + std::to_string(i) + ".log");
      }
    }
  }

  static std::string Spec(bool tied, const std::string& extra) {
    return absl::StrCat(
        "name: llama\nsteps: 2\nseed: 11\nmodel:\n  preset: llama-tiny\n  tie_embeddings: ",
        tied ? "true" : "false",
        "\ndata:\n  source: file\n  path: window.txt\n  val_fraction: 0\n"
        "optimizer:\n  lr: 1e-30\n  lr_schedule: constant\n"
        "pipeline:\n  stages: 2\n  micro_batch_size: 2\n  micro_batches: 2\n"
        "  partition: uniform\n",
        extra);
  }

  // Runs the job to its end; SUCCEEDED with two equal losses (the weights do not move).
  absl::StatusOr<v1::Job> Run(const std::string& yaml) {
    auto id = cluster_->Submit(yaml);
    if (!id.ok()) return id.status();
    auto job = cluster_->WaitForEnd(*id, 120s);
    if (!job.ok()) return job.status();
    if (job->state() != v1::SUCCEEDED || job->history_size() != 2) {
      return absl::InternalError(absl::StrCat(*id, " ended ", v1::JobState_Name(job->state()),
                                              " with ", job->history_size(),
                                              " steps: ", job->reason()));
    }
    return job;
  }

  // `tandem export` of the job into a directory of its own; the file's path.
  std::string Export(const std::string& job_id, const std::string& dir_name) {
    const std::string dir = cluster_->dir() + "/" + dir_name;
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/model.safetensors";
    CommandResult cli = cluster_->Cli({"export", job_id, "-o", path});
    EXPECT_EQ(cli.exit_code, 0) << cli.err;
    EXPECT_THAT(cli.out, ::testing::HasSubstr("wrote " + dir + "/config.json"));
    return path;
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(LlamaInteropTest, ExportMatchesAnIndependentForwardAndFineTunesFromIt) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const std::string tag = tied ? "tied" : "untied";
    absl::StatusOr<v1::Job> job = Run(Spec(tied, ""));
    ASSERT_TRUE(job.ok()) << job.status();
    const double loss = job->history(0).loss();
    EXPECT_EQ(job->history(1).loss(), loss);  // lr 1e-30 moves no weight
    EXPECT_GT(loss, 4.0);                     // an untrained model: about ln 256

    // The numpy reference on the exported file, config.json and the same window.
    const std::string exported = Export(job->id(), tag);
    const std::string config = cluster_->dir() + "/" + tag + "/config.json";
    ASSERT_TRUE(std::filesystem::exists(config));
    CommandResult py =
        RunCommand({"/usr/bin/env", "python3",
                    std::string(TANDEM_SOURCE_DIR) + "/tests/scripts/llama_reference.py", exported,
                    config, cluster_->dir() + "/window.txt"});
    ASSERT_EQ(py.exit_code, 0) << py.err;
    double reference = 0;
    ASSERT_TRUE(absl::SimpleAtod(absl::StripAsciiWhitespace(py.out), &reference)) << py.out;
    std::cout << "[ llama " << tag << " ] Tandem loss " << absl::StrCat(loss)
              << ", numpy reference " << absl::StrCat(reference) << ", relative difference "
              << std::abs(loss - reference) / reference << "\n";
    EXPECT_NEAR(loss, reference, 1e-5 * reference);

    // Fine-tune from the exported file: the new job starts at the exported model's loss.
    const std::string models = cluster_->data_root() + "/models";
    std::filesystem::create_directories(models);
    std::filesystem::copy_file(exported, models + "/" + tag + ".safetensors");
    absl::StatusOr<v1::Job> ft =
        Run(Spec(tied, absl::StrCat("init:\n  hf_file: ", tag, ".safetensors\n")));
    ASSERT_TRUE(ft.ok()) << ft.status();
    EXPECT_DOUBLE_EQ(ft->history(0).loss(), loss);
    // Export -> import -> export is the identity, to the byte.
    const std::string again = Export(ft->id(), tag + "-again");
    EXPECT_EQ(ReadFile(again), ReadFile(exported));
  }
}

}  // namespace
}  // namespace tandem::testing
