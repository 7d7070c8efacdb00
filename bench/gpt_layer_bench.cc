// Time of one GPT-2 (124M shape) transformer block forward + backward, and of the head +
// cross-entropy forward + backward, on the CPU reference kernels, at 1 and 2 OpenBLAS
// threads. bench/torch_gpt_layer.py prints the same table for PyTorch on the same shapes.
//
//   build/bin/bench_gpt_layer [--reps N] [--b 4] [--t 256] [--c 768] [--nh 12] [--v 50304]
//                             [--threads 1,2] [--keep-heap 1]
//
// --keep-heap 1 makes glibc malloc serve every allocation from the heap and never trim it
// (mallopt M_MMAP_MAX = 0, M_TRIM_THRESHOLD = INT_MAX), so the step's large activation
// buffers stop being mmapped and page-faulted afresh on every forward (13% of the block's time
// here). It is process-wide allocator policy, a choice for a daemon's main(), not for a library.
//
// FLOPs, 2*m*n*k per GEMM (N = B*T rows, C = d_model, H = 4C):
//   block forward  = 2*N*C*(3C + C + H + H)    [c_attn, attn.c_proj, c_fc, mlp.c_proj]
//                  + 2 * 2*B*T*T*C              [q k^T and att v over all heads, full T x T]
//   block backward = 2 x the linear GEMMs (input and weight gradients)
//                  + 4 * 2*B*T*T*C              [d att, d v, d q, d k]
//   head           = 3 * 2*N*C*V                [logits; d ln_f; d W]
// Elementwise work (LayerNorm, GELU, softmax, the residual adds) is timed but not counted.
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/layer_timing.h"
#include "worker/model/gpt.h"
#include "worker/model/random.h"

namespace {

using tandem::bench::PrintRow;
using tandem::bench::TimeLayer;
using tandem::worker::GptBlock;
using tandem::worker::GptConfig;
using tandem::worker::GptHead;
using tandem::worker::IntTensor;
using tandem::worker::MicroBatchData;
using tandem::worker::Rng;
using tandem::worker::Tensor;

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  int64_t b = 4, t = 256, c = 768, nh = 12, v = 50304;
  std::vector<int> threads = {1, 2};
  bool keep_heap = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    int64_t value = 0;
    if (flag == "--threads") {
      threads.clear();
      for (absl::string_view part : absl::StrSplit(argv[i + 1], ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(part, &n) || n < 1) {
          std::fprintf(stderr, "bad --threads\n");
          return 2;
        }
        threads.push_back(n);
      }
      continue;
    }
    if (!absl::SimpleAtoi(argv[i + 1], &value) || value < 0) {
      std::fprintf(stderr, "bad value for %s\n", flag.c_str());
      return 2;
    }
    if (flag == "--keep-heap") {
      keep_heap = value != 0;
      continue;
    }
    if (value < 1) {
      std::fprintf(stderr, "%s must be >= 1\n", flag.c_str());
      return 2;
    }
    if (flag == "--reps") {
      reps = static_cast<int>(value);
    } else if (flag == "--b") {
      b = value;
    } else if (flag == "--t") {
      t = value;
    } else if (flag == "--c") {
      c = value;
    } else if (flag == "--nh") {
      nh = value;
    } else if (flag == "--v") {
      v = value;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (keep_heap) tandem::bench::KeepHeap();
  GptConfig cfg;
  cfg.n_layer = 12;
  cfg.n_head = nh;
  cfg.d_model = c;
  cfg.d_hidden = 4 * c;
  cfg.seq_len = t;
  cfg.vocab = v;
  cfg.tie_embeddings = true;
  const double n = static_cast<double>(b * t);
  const double linear = 2.0 * n * c * (3.0 * c + c + 2.0 * cfg.d_hidden);
  const double attention = 2.0 * 2.0 * b * t * t * c;
  const double block_flops = 3.0 * linear + 3.0 * attention;
  const double head_flops = 3.0 * 2.0 * n * c * v;

  GptBlock block(cfg, 0, 1234);
  GptHead head(cfg, 1234);
  Tensor x({b, t, c});
  Rng rng(7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rng.Normal());
  IntTensor targets({b, t});
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i] = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(v)));
  }
  MicroBatchData head_data;
  head_data.targets = &targets;
  head_data.loss_normalizer = b * t;

  std::printf("tandem: B=%lld T=%lld C=%lld NH=%lld V=%lld, median of %d (after 1 warm-up)%s\n",
              static_cast<long long>(b), static_cast<long long>(t), static_cast<long long>(c),
              static_cast<long long>(nh), static_cast<long long>(v), reps,
              keep_heap ? ", keep-heap" : "");
  std::printf("%-22s %7s %10s %10s %9s\n", "what", "threads", "fwd ms", "fwd+bwd ms", "GFLOP/s");
  for (int th : threads) {
    openblas_set_num_threads(th);
    double fwd = 0;
    const double ms = TimeLayer(block, x, MicroBatchData{}, reps, &fwd);
    PrintRow("block fwd+bwd", th, fwd, ms, block_flops);
  }
  for (int th : threads) {
    openblas_set_num_threads(th);
    double fwd = 0;
    const double ms = TimeLayer(head, x, head_data, reps, &fwd);
    PrintRow("head+loss fwd+bwd", th, fwd, ms, head_flops);
  }
  std::printf("counted GFLOP: block %.2f (attention %.2f), head %.2f\n", block_flops / 1e9,
              3.0 * attention / 1e9, head_flops / 1e9);
  return 0;
}
