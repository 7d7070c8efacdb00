// A whole GPT stage trained as a worker trains it (M micro-batches, each a forward then a
// backward, then the AdamW update), timed layer by layer, against the layer profile the workers
// measure (worker/profiler.h: the embedding, one block and the head, each pass alone after a
// cache flush) in the same process: how far the profile's sum is from the stage it prices, and
// which layers differ. One thread, the worker's allocator policy (--keep-heap), rounds of a
// fresh profile then the stage's steps, so that a drift of the host shows as rounds that
// disagree.
//
//   build/bin/bench_stage_profile [--rounds 2] [--steps 3] [--m 4] [--b 4] [--t 128]
//                                 [--n-layer 6] [--c 768] [--v 50304] [--order 1f1b]
//
// --order: the order of the stage's passes in a step. 1f1b (the default) runs each
// micro-batch's backward right after its forward, one micro-batch's activations live at a
// time; gpipe runs every forward first, so all M are live at once; both runs the two orders
// one after the other in each round, to tell what the live footprint costs an action from
// what the host's drift does.
//
// Prints per round and order: the stage's forward and backward (median over its micro-batches)
// and its update phase (the gradient-norm pass then AdamW, as CpuStageCompute runs them)
// against the profiled layers' sum, and each layer's forward and backward off its profile in
// percent.
#include <cblas.h>
#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/layer_timing.h"
#include "common/grad_clip.h"
#include "tandem/v1/spec.pb.h"
#include "worker/model/kernels.h"
#include "worker/model/model_layers.h"
#include "worker/model/optimizer.h"
#include "worker/model/random.h"
#include "worker/profiler.h"

namespace {

using tandem::bench::Median;
using tandem::bench::NowMs;
using tandem::worker::IntTensor;
using tandem::worker::Layer;
using tandem::worker::MicroBatchData;
using tandem::worker::Parameter;
using tandem::worker::Rng;
using tandem::worker::SavedContext;
using tandem::worker::Tensor;

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rounds = 2, steps = 3, m = 4, b = 4, t = 128, n_layer = 6, c = 768, v = 50304;
  std::vector<bool> orders = {false};  // true: GPipe's order
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 == argc) {  // a flag without its value (or --help): the usage, not a run
      std::fprintf(stderr,
                   "usage: %s [--rounds N] [--steps N] [--m N] [--b N] [--t N] [--n-layer N] "
                   "[--c N] [--v N] [--order 1f1b|gpipe|both]\n",
                   argv[0]);
      return 2;
    }
    if (flag == "--order") {
      const std::string order = argv[i + 1];
      if (order != "1f1b" && order != "gpipe" && order != "both") {
        std::fprintf(stderr, "--order takes 1f1b, gpipe or both, not '%s'\n", order.c_str());
        return 2;
      }
      orders = order == "1f1b"    ? std::vector<bool>{false}
               : order == "gpipe" ? std::vector<bool>{true}
                                  : std::vector<bool>{false, true};
      continue;
    }
    int64_t value = 0;
    if (!absl::SimpleAtoi(argv[i + 1], &value) || value < 1) {
      std::fprintf(stderr, "%s needs a number >= 1\n", flag.c_str());
      return 2;
    }
    int64_t* target = flag == "--rounds"    ? &rounds
                      : flag == "--steps"   ? &steps
                      : flag == "--m"       ? &m
                      : flag == "--b"       ? &b
                      : flag == "--t"       ? &t
                      : flag == "--n-layer" ? &n_layer
                      : flag == "--c"       ? &c
                      : flag == "--v"       ? &v
                                            : nullptr;
    if (target == nullptr) {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
    *target = value;
  }
  // As tandem-worker runs (--keep-heap, one arena, --threads 1).
  tandem::bench::KeepHeap();
  mallopt(M_ARENA_MAX, 1);
  openblas_set_num_threads(1);

  tandem::v1::JobSpec spec;
  spec.set_seed(1234);
  tandem::v1::ModelSpec* model = spec.mutable_model();
  model->set_arch("gpt");
  model->set_n_layer(static_cast<int32_t>(n_layer));
  model->set_n_head(static_cast<int32_t>(c / 64));
  model->set_d_model(static_cast<int32_t>(c));
  model->set_seq_len(static_cast<int32_t>(t));
  model->set_vocab_size(static_cast<int32_t>(v));
  model->set_tie_embeddings(false);
  spec.mutable_pipeline()->set_micro_batch_size(static_cast<int32_t>(b));
  const int layers_total = static_cast<int>(n_layer) + 2;  // embedding, blocks, head

  auto built = tandem::worker::BuildModelLayers(spec, 0, layers_total);
  Check(built.status(), "build");
  std::vector<std::unique_ptr<Layer>>& layers = *built;
  std::vector<Parameter*> params;
  for (const auto& l : layers) {
    for (Parameter* p : l->Parameters()) params.push_back(p);
  }
  auto opt = tandem::worker::MakeOptimizer(spec.optimizer(), params);
  Check(opt.status(), "optimizer");

  Rng rng(7);
  IntTensor tokens({b, t}), targets({b, t});
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(v)));
    targets[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(v)));
  }
  const MicroBatchData data{&tokens, &targets, b * t * m};

  std::printf("GPT L=%lld C=%lld T=%lld V=%lld, micro-batch %lld, M=%lld, %lld steps per round\n",
              static_cast<long long>(n_layer), static_cast<long long>(c), static_cast<long long>(t),
              static_cast<long long>(v), static_cast<long long>(b), static_cast<long long>(m),
              static_cast<long long>(steps));
  for (int64_t round = 0; round < rounds; ++round) {
    // The profile as the workers measure it: the embedding, one block, the head.
    std::vector<double> pf(layers_total), pb(layers_total), pa(layers_total);
    auto profile = tandem::worker::ProfileLayers(spec, {0, 1, layers_total - 1}, 3);
    Check(profile.status(), "profile");
    for (const auto& lp : *profile) {
      pf[lp.layer()] = lp.forward_seconds() * 1e3;
      pb[lp.layer()] = lp.backward_seconds() * 1e3;
      pa[lp.layer()] = lp.apply_seconds() * 1e3;
    }
    for (int l = 2; l < layers_total - 1; ++l) {
      pf[l] = pf[1];
      pb[l] = pb[1];
      pa[l] = pa[1];
    }
    // The stage's steps in each order asked for, one after the other in the same round.
    for (const bool gpipe_order : orders) {
      std::vector<std::vector<double>> f(layers.size()), bw(layers.size());
      std::vector<double> stage_f, stage_b, update;
      for (int64_t s = 0; s <= steps; ++s) {  // step 0 warms up
        // 1F1B's footprint: each micro-batch's backward right after its forward, one live at a
        // time. GPipe's: every forward first, so M micro-batches' activations are live at once.
        std::vector<std::vector<SavedContext>> saved(static_cast<size_t>(m));
        const auto forward = [&](int64_t mb) {
          saved[mb].resize(layers.size());
          Tensor x, y;
          const double t0 = NowMs();
          for (size_t l = 0; l < layers.size(); ++l) {
            const double a = NowMs();
            Check(layers[l]->Forward(x, data, saved[mb][l], y), "forward");
            std::swap(x, y);
            if (s > 0) f[l].push_back(NowMs() - a);
          }
          if (s > 0) stage_f.push_back(NowMs() - t0);
        };
        const auto backward = [&](int64_t mb) {
          Tensor g, gin;
          const double t1 = NowMs();
          for (size_t l = layers.size(); l-- > 0;) {
            const double a = NowMs();
            Check(layers[l]->Backward(g, saved[mb][l], gin), "backward");
            std::swap(g, gin);
            if (s > 0) bw[l].push_back(NowMs() - a);
          }
          saved[mb].clear();
          if (s > 0) stage_b.push_back(NowMs() - t1);
        };
        if (gpipe_order) {
          for (int64_t mb = 0; mb < m; ++mb) forward(mb);
          for (int64_t mb = m; mb-- > 0;) backward(mb);
        } else {
          for (int64_t mb = 0; mb < m; ++mb) {
            forward(mb);
            backward(mb);
          }
        }
        // The update phase as the worker runs it: the gradient-norm pass, then AdamW with the
        // clipping factor (CpuStageCompute::GradientStats, then Apply).
        const double t2 = NowMs();
        double norm = 0.0;
        for (const Parameter* q : params) {
          norm += tandem::worker::kernels::SumOfSquares(q->grad.data(),
                                                        static_cast<int64_t>(q->grad.size()));
        }
        (*opt)->Step(1e-6f, tandem::ClipScale(std::sqrt(norm), spec.optimizer().grad_clip()));
        if (s > 0) update.push_back(NowMs() - t2);
      }
      double sum_pf = 0, sum_pb = 0, sum_pa = 0;
      std::string per_f, per_b;
      for (size_t l = 0; l < layers.size(); ++l) {
        sum_pf += pf[l];
        sum_pb += pb[l];
        sum_pa += pa[l];
        absl::StrAppend(&per_f, " ", static_cast<int>(100 * (Median(f[l]) / pf[l] - 1)));
        absl::StrAppend(&per_b, " ", static_cast<int>(100 * (Median(bw[l]) / pb[l] - 1)));
      }
      const double sf = Median(stage_f), sb = Median(stage_b);
      std::printf(
          "round %lld, %s: forward %.1f ms (profile %.1f, %+.1f%%), backward %.1f ms (profile "
          "%.1f, %+.1f%%), update %.1f ms (profile %.1f, %+.1f%%)\n  each layer's forward off its "
          "profile, %%:%s\n  backward:%s\n",
          static_cast<long long>(round), gpipe_order ? "gpipe order" : "1f1b order", sf, sum_pf,
          100 * (sf / sum_pf - 1), sb, sum_pb, 100 * (sb / sum_pb - 1), Median(update), sum_pa,
          100 * (Median(update) / sum_pa - 1), per_f.c_str(), per_b.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
