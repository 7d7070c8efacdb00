#include "worker/device_name.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CpuModelNameTest, TakesTheFirstModelNameWithBlanksCollapsed) {
  const char* x86 =
      "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: 143\n"
      "model name\t: Intel(R) Xeon(R)  Platinum 8481C CPU @ 2.70GHz\n\n"
      "processor\t: 1\nmodel name\t: something else\n";
  EXPECT_EQ(CpuModelName(x86), "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz");
}

TEST(CpuModelNameTest, FallsBackToHardwareThenTheArmPartThenUnknown) {
  EXPECT_EQ(CpuModelName("processor : 0\nHardware : BCM2835\n"), "BCM2835");
  EXPECT_EQ(CpuModelName("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"),
            "CPU implementer 0x41 part 0xd0c");
  EXPECT_EQ(CpuModelName(""), "unknown processor");
  EXPECT_EQ(CpuModelName("model name\t:\n"), "unknown processor");
}

TEST(RegisteredDeviceNameTest, MakesOneLineOfTextWithinTheLimit) {
  EXPECT_EQ(RegisteredDeviceName("  NVIDIA\tH100\n80GB  HBM3 \x7f"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(RegisteredDeviceName(std::string(300, 'x')).size(), kMaxDeviceNameBytes);
  EXPECT_EQ(RegisteredDeviceName(""), "");
}

TEST(CpuDeviceNameTest, NamesTheProcessorAndOpenBlasKernelsWithinTheLimit) {
  const std::string name = CpuDeviceName();
  EXPECT_THAT(name, HasSubstr(" / OpenBLAS "));
  EXPECT_THAT(name, testing::Not(StartsWith(" / ")));
  EXPECT_LE(name.size(), kMaxDeviceNameBytes);
}

// The kernels OpenBLAS picked against the processor's flags: the VM of this project's
// benchmarks (an AVX-512 Xeon that OpenBLAS 0.3.21 takes for a Prescott) gets the advice to
// select SkylakeX; an AVX2 processor on SSE kernels, Haswell; kernels that fit, none.
TEST(BlasCoreAdviceTest, NamesTheCoreTypeWhenOpenBlasPickedOlderKernels) {
  const std::string avx512 =
      "model name\t: Intel(R) Xeon(R) Processor\n"
      "flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl\n";
  const std::string advice = BlasCoreAdvice(avx512, "Prescott");
  EXPECT_THAT(advice, HasSubstr("OpenBLAS runs its Prescott GEMM kernels on a processor with "
                                "AVX-512 (Intel(R) Xeon(R) Processor)"));
  EXPECT_THAT(advice, HasSubstr("OPENBLAS_CORETYPE=SkylakeX"));
  EXPECT_THAT(BlasCoreAdvice(avx512, "Haswell"), HasSubstr("OPENBLAS_CORETYPE=SkylakeX"));
  EXPECT_EQ(BlasCoreAdvice(avx512, "SkylakeX"), "");
  EXPECT_EQ(BlasCoreAdvice(avx512, "Cooperlake"), "");
  const std::string avx2 = "model name : AMD EPYC 7B12\nflags : sse sse2 avx avx2 fma\n";
  EXPECT_THAT(BlasCoreAdvice(avx2, "Sandybridge"), HasSubstr("OPENBLAS_CORETYPE=Haswell"));
  EXPECT_EQ(BlasCoreAdvice(avx2, "Zen"), "");
  EXPECT_EQ(BlasCoreAdvice("model name : old\nflags : sse sse2 sse3\n", "Prescott"), "");
  EXPECT_EQ(BlasCoreAdvice("CPU part : 0xd0c\n", "NEOVERSEN1"), "");  // no flags line
  // Only the whole flag counts: avx512fp16 alone is not AVX-512 F/BW/DQ/VL.
  EXPECT_EQ(BlasCoreAdvice("flags : avx512fp16 avx2\n", "Haswell"), "");
}

// Why the kernels are older: OpenBLAS did not know the model (then --blas_core=auto helps), or
// OPENBLAS_CORETYPE asked for them, or asked for others that OpenBLAS does not have.
TEST(BlasCoreAdviceTest, SaysWhyFromTheEnvironment) {
  const std::string avx512 =
      "model name : Xeon\nflags : avx2 fma avx512f avx512dq avx512bw avx512vl\n";
  EXPECT_THAT(BlasCoreAdvice(avx512, "Prescott"),
              HasSubstr("(Xeon): it did not recognise the model. Its AVX-512 kernels run several "
                        "times faster: OPENBLAS_CORETYPE=SkylakeX or --blas_core=auto selects"));
  const std::string asked = BlasCoreAdvice(avx512, "Prescott", "prescott");
  EXPECT_THAT(asked, HasSubstr("(Xeon), as OPENBLAS_CORETYPE=prescott asks. Its AVX-512"));
  EXPECT_THAT(asked, testing::Not(HasSubstr("--blas_core")));
  EXPECT_THAT(BlasCoreAdvice(avx512, "Prescott", "SkylakeX"),
              HasSubstr("although OPENBLAS_CORETYPE=SkylakeX asks for others"));
  EXPECT_EQ(BlasCoreAdvice(avx512, "SkylakeX", "SkylakeX"), "");
}

TEST(BetterBlasCoreTypeTest, NamesTheProcessorsKernelsOnlyWhenOpenBlasPickedOlderOnes) {
  const std::string avx512 =
      "model name\t: Intel(R) Xeon(R) Processor\n"
      "flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl\n";
  EXPECT_EQ(BetterBlasCoreType(avx512, "Prescott"), "SkylakeX");
  EXPECT_EQ(BetterBlasCoreType(avx512, "HASWELL"), "SkylakeX");  // OpenBLAS's case varies
  EXPECT_EQ(BetterBlasCoreType(avx512, "SapphireRapids"), "");
  const std::string avx2 = "flags : sse sse2 avx avx2 fma\n";
  EXPECT_EQ(BetterBlasCoreType(avx2, "Prescott"), "Haswell");
  EXPECT_EQ(BetterBlasCoreType(avx2, "Excavator"), "");
  EXPECT_EQ(BetterBlasCoreType("flags : sse sse2 avx avx2\n", "Sandybridge"), "");  // no FMA
  EXPECT_EQ(BetterBlasCoreType("", "Prescott"), "");
}

TEST(BetterBlasCoreTypeTest, ThisProcessesAnswerAgreesWithItsAdvice) {
  EXPECT_EQ(BetterBlasCoreType().empty(), BlasCoreAdvice().empty());
  EXPECT_FALSE(OpenBlasCoreName().empty());
}

}  // namespace
}  // namespace tandem::worker
