// The dashboard's files (coordinator/dashboard/), compiled into the coordinator: the page
// needs nothing from the network. dashboard_assets.cc is generated from them at build time
// (coordinator/dashboard/embed.cmake).
#ifndef TANDEM_COORDINATOR_DASHBOARD_ASSETS_H_
#define TANDEM_COORDINATOR_DASHBOARD_ASSETS_H_

#include <string_view>

namespace tandem::coordinator {

struct DashboardAsset {
  std::string_view name;          // file name under coordinator/dashboard/, e.g. "app.js"
  std::string_view content_type;  // by extension
  std::string_view data;
};

// The asset named `name` exactly, or null.
const DashboardAsset* FindDashboardAsset(std::string_view name);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_DASHBOARD_ASSETS_H_
