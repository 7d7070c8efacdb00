// What the coordinator's HTTP port answers: Prometheus metrics, the dashboard's page and
// assets, and the JSON and SVG the page polls. Plain request and response structs, no HTTP
// library and no socket (coordinator/http_server.h carries them over HTTP), so that every
// route is tested by calling Handle().
//
// Routes (GET or HEAD; any other method is 405):
//   /metrics                          Prometheus text exposition (coordinator/metrics.h)
//   /, /jobs/<id>                     the dashboard page (coordinator/dashboard/)
//   /static/<file>                    its script and style sheet
//   /api/jobs                         every job, without history
//   /api/jobs/<id>[?after=N]          one job, its stages and its step series (after step N)
//   /api/jobs/<id>/trace.svg[?step=N] a kept step's timeline (the latest by default), as
//                                     `tandem trace --svg` draws it
//   /api/workers                      the registered workers
// Anything else is 404 with a message. Nothing a request carries is executed or opened as a
// file: paths are matched against the fixed routes, a job id must look like one, and numbers
// must parse whole.
//
// The data come from the JobStore and WorkerRegistry, the same state the gRPC services
// serve. Thread-safe (they are).
#ifndef TANDEM_COORDINATOR_WEB_HANDLERS_H_
#define TANDEM_COORDINATOR_WEB_HANDLERS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/job_store.h"
#include "coordinator/metrics.h"
#include "coordinator/worker_registry.h"

namespace tandem::coordinator {

struct HttpRequest {
  std::string method = "GET";
  std::string path;                          // without the query string, percent-decoded
  std::map<std::string, std::string> query;  // decoded parameters (the first of repeats)
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type
};

struct WebEnv {
  const JobStore* store = nullptr;
  const WorkerRegistry* registry = nullptr;
  CoordinatorMetrics* metrics = nullptr;
};

// Series points a job's JSON carries at most; a longer history is thinned evenly (keeping the
// latest step and every validation point).
inline constexpr size_t kMaxSeriesPoints = 2000;

class WebHandlers {
 public:
  explicit WebHandlers(const WebEnv& env) : env_(env) {}

  HttpResponse Handle(const HttpRequest& request) const;

 private:
  HttpResponse Jobs() const;
  HttpResponse Job(const std::string& id, const HttpRequest& request) const;
  HttpResponse Trace(const std::string& id, const HttpRequest& request) const;
  HttpResponse Workers() const;

  WebEnv env_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_WEB_HANDLERS_H_
