// pipeline.transport resolved on a gang of workers: which workers share a GPU, and the
// transport (or the refusal) each spec and gang get.
#include "coordinator/transport_choice.h"

#include <string>
#include <vector>

#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

using ::testing::HasSubstr;

WorkerRecord Worker(const std::string& id, const std::string& device, const std::string& host,
                    const std::string& uuid = "") {
  WorkerRecord w;
  w.id = id;
  w.address = "127.0.0.1:" + id;
  w.device = device;
  w.hostname = host;
  w.device_uuid = uuid;
  return w;
}

v1::JobSpec Spec(const std::string& device, const std::string& transport) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecYaml(
      "device: " + device + "\npipeline:\n  stages: 2\n  transport: " + transport + "\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

constexpr char kUuidA[] = "GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f";
constexpr char kUuidB[] = "GPU-11111111-2222-3333-4444-555555555555";

TEST(ShareDeviceTest, ByUuidWhenBothHaveOne) {
  // Equal uuids: one GPU, whatever the hosts and ordinals say (CUDA_VISIBLE_DEVICES renumbers).
  EXPECT_TRUE(
      ShareDevice(Worker("w-1", "cuda:0", "h", kUuidA), Worker("w-2", "cuda:1", "h", kUuidA)));
  // Different uuids: two GPUs, even at the same host and ordinal (two containers).
  EXPECT_FALSE(
      ShareDevice(Worker("w-1", "cuda:0", "h", kUuidA), Worker("w-2", "cuda:0", "h", kUuidB)));
}

TEST(ShareDeviceTest, ByHostAndDeviceWhenAUuidIsMissing) {
  EXPECT_TRUE(ShareDevice(Worker("w-1", "cuda:0", "h"), Worker("w-2", "cuda:0", "h")));
  EXPECT_TRUE(ShareDevice(Worker("w-1", "cuda:0", "h", kUuidA), Worker("w-2", "cuda:0", "h")));
  EXPECT_FALSE(ShareDevice(Worker("w-1", "cuda:0", "h"), Worker("w-2", "cuda:1", "h")));
  EXPECT_FALSE(ShareDevice(Worker("w-1", "cuda:0", "h"), Worker("w-2", "cuda:0", "g")));
  // An unknown host cannot be told apart: taken as apart.
  EXPECT_FALSE(ShareDevice(Worker("w-1", "cuda:0", ""), Worker("w-2", "cuda:0", "")));
}

TEST(ShareDeviceTest, CpuWorkersShareNoDevice) {
  EXPECT_FALSE(ShareDevice(Worker("w-1", "cpu", "h"), Worker("w-2", "cpu", "h")));
}

TEST(ChooseTransportTest, CpuJobsUseGloo) {
  const std::vector<WorkerRecord> gang = {Worker("w-1", "cpu", "h"), Worker("w-2", "cpu", "h")};
  EXPECT_EQ(*ChooseTransport(Spec("cpu", "auto"), gang), "gloo");
  EXPECT_EQ(*ChooseTransport(Spec("cpu", "gloo"), gang), "gloo");
}

TEST(ChooseTransportTest, CudaAutoIsNcclOnSeparateGpusAndGlooOnAShared) {
  const std::vector<WorkerRecord> apart = {Worker("w-1", "cuda:0", "h", kUuidA),
                                           Worker("w-2", "cuda:1", "h", kUuidB)};
  EXPECT_EQ(*ChooseTransport(Spec("cuda", "auto"), apart), "nccl");
  // Any two of the gang, not only neighbours: ranks 0 and 2 share here.
  const std::vector<WorkerRecord> shared = {Worker("w-1", "cuda:0", "h", kUuidA),
                                            Worker("w-2", "cuda:1", "h", kUuidB),
                                            Worker("w-3", "cuda:0", "h", kUuidA)};
  EXPECT_EQ(*ChooseTransport(Spec("cuda", "auto"), shared), "gloo");
  // One worker: no pair, NCCL (a one-rank job moves nothing).
  EXPECT_EQ(*ChooseTransport(Spec("cuda", "auto"), {Worker("w-1", "cuda:0", "h")}), "nccl");
}

TEST(ChooseTransportTest, CudaGlooIsAlwaysGloo) {
  const std::vector<WorkerRecord> apart = {Worker("w-1", "cuda:0", "h"),
                                           Worker("w-2", "cuda:1", "h")};
  EXPECT_EQ(*ChooseTransport(Spec("cuda", "gloo"), apart), "gloo");
}

TEST(ChooseTransportTest, CudaNcclOnSeparateGpus) {
  const std::vector<WorkerRecord> apart = {Worker("w-1", "cuda:0", "h"),
                                           Worker("w-2", "cuda:0", "g")};
  EXPECT_EQ(*ChooseTransport(Spec("cuda", "nccl"), apart), "nccl");
}

TEST(ChooseTransportTest, CudaNcclOnASharedGpuIsRefusedNamingWorkersAndGpu) {
  const std::vector<WorkerRecord> shared = {Worker("w-1", "cuda:0", "h", kUuidA),
                                            Worker("w-2", "cuda:0", "h", kUuidA)};
  absl::StatusOr<std::string> t = ChooseTransport(Spec("cuda", "nccl"), shared);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.status().message(),
            "pipeline.transport: nccl: workers w-1 and w-2 share "
            "GPU-8c7f2b1e-0f3a-4c1d-9e2b-5a6b7c8d9e0f (cuda:0 on host h); NCCL cannot put two "
            "ranks on one device: use pipeline.transport: gloo or auto");
  // Without a uuid the device and host name it.
  t = ChooseTransport(Spec("cuda", "nccl"),
                      {Worker("w-4", "cuda:1", "gpu-box"), Worker("w-7", "cuda:1", "gpu-box")});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("workers w-4 and w-7 share cuda:1 on host gpu-box; NCCL cannot"));
}

TEST(ChooseTransportTest, AnUnknownTransportIsInvalid) {
  v1::JobSpec spec = Spec("cuda", "auto");
  spec.mutable_pipeline()->set_transport("mpi");
  absl::StatusOr<std::string> t = ChooseTransport(spec, {});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("pipeline.transport: "));
}

}  // namespace
}  // namespace tandem::coordinator
