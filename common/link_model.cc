#include "common/link_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// Sum of squared residuals of (a, b) over the samples.
double SquaredError(const v1::LinkProfile& link, double a, double b) {
  double sse = 0.0;
  for (const v1::LinkSample& s : link.samples()) {
    const double r = s.one_way_seconds() - (a + b * static_cast<double>(s.bytes()));
    sse += r * r;
  }
  return sse;
}

}  // namespace

double TransferSeconds(const v1::LinkProfile& link, int64_t bytes) {
  if (bytes <= 0) return 0.0;
  return link.latency_seconds() + static_cast<double>(bytes) * link.seconds_per_byte();
}

double AllReduceSeconds(const v1::LinkProfile& link, int64_t bytes, int ranks) {
  if (bytes <= 0 || ranks < 2) return 0.0;
  // A ring: R - 1 reduce-scatter and R - 1 all-gather steps, each moving bytes / R per rank.
  const int64_t piece = (bytes + ranks - 1) / ranks;
  if (link.allreduce_bytes() > 0 && link.allreduce_seconds() > 0) {
    // Measured on 2 ranks: two steps of half the bytes each, so t = 2 latency + bytes x k.
    const double per_byte = std::max(0.0, link.allreduce_seconds() - 2.0 * link.latency_seconds()) /
                            static_cast<double>(link.allreduce_bytes());
    return 2.0 * (ranks - 1) * (link.latency_seconds() + static_cast<double>(piece) * per_byte);
  }
  return 2.0 * (ranks - 1) * TransferSeconds(link, piece);
}

absl::Status FitLink(v1::LinkProfile* link) {
  const int n = link->samples_size();
  if (n == 0) return absl::InvalidArgumentError("link fit: no samples");
  for (int i = 0; i < n; ++i) {
    const v1::LinkSample& s = link->samples(i);
    if (s.bytes() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("link fit: samples[", i, "].bytes is ", s.bytes(), "; expected > 0"));
    }
    if (!std::isfinite(s.one_way_seconds()) || s.one_way_seconds() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("link fit: samples[", i,
                                                     "].one_way_seconds is ", s.one_way_seconds(),
                                                     "; expected a finite time >= 0"));
    }
  }
  // Centred sums keep the fit exact enough for sizes up to 1 GiB.
  double x_mean = 0.0, y_mean = 0.0;
  for (const v1::LinkSample& s : link->samples()) {
    x_mean += static_cast<double>(s.bytes());
    y_mean += s.one_way_seconds();
  }
  x_mean /= n;
  y_mean /= n;
  double sxx = 0.0, sxy = 0.0, xx = 0.0, xy = 0.0;
  for (const v1::LinkSample& s : link->samples()) {
    const double x = static_cast<double>(s.bytes());
    const double y = s.one_way_seconds();
    sxx += (x - x_mean) * (x - x_mean);
    sxy += (x - x_mean) * (y - y_mean);
    xx += x * x;
    xy += x * y;
  }
  double a = y_mean, b = 0.0;  // one distinct size: all latency
  if (sxx > 0.0) {
    b = sxy / sxx;
    a = y_mean - b * x_mean;
    if (a < 0.0 || b < 0.0) {
      // The constrained optimum lies on an edge of the feasible quadrant: all latency
      // (b = 0, a = the mean) or all bandwidth (a = 0, b through the origin). Take the better.
      const double b_only = std::max(0.0, xy / xx);
      if (SquaredError(*link, y_mean, 0.0) <= SquaredError(*link, 0.0, b_only)) {
        a = y_mean;
        b = 0.0;
      } else {
        a = 0.0;
        b = b_only;
      }
    }
  }
  link->set_latency_seconds(a);
  link->set_seconds_per_byte(b);
  return absl::OkStatus();
}

}  // namespace tandem
