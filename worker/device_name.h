// The name of the hardware a worker computes on, as it registers it
// (RegisterRequest.device_name): the coordinator keys layer profiles by it, so that one measured
// on one kind of processor is never used to plan a job on another. A cuda worker names its GPU
// (cuda::DeviceInfo.name); a cpu worker its processor and the GEMM kernels OpenBLAS chose for
// it, since the same processor runs at another speed on another kernel (OPENBLAS_CORETYPE).
#ifndef TANDEM_WORKER_DEVICE_NAME_H_
#define TANDEM_WORKER_DEVICE_NAME_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"
#include "common/limits.h"

namespace tandem::worker {

// `name` as registered: each control character (tabs, newlines) made a blank, runs of blanks made
// one, trimmed, and cut to kMaxDeviceNameBytes (the coordinator refuses control characters and
// longer names).
std::string RegisteredDeviceName(absl::string_view name);

// The processor's name in /proc/cpuinfo text: the first "model name" (x86, and arm64 kernels
// that print one), else "Hardware", else "CPU implementer" and "CPU part" (other arm64), with
// runs of blanks made one; "unknown processor" when none is there.
std::string CpuModelName(absl::string_view cpuinfo);

// "<CpuModelName> / OpenBLAS <core>" (core: openblas_get_corename(), e.g. "SkylakeX" or
// "Haswell"), as RegisteredDeviceName makes it. Reads /proc/cpuinfo; where it cannot, the processor
// is "unknown processor".
std::string CpuDeviceName();

// The kernels OpenBLAS chose for this process (openblas_get_corename(), e.g. "SkylakeX").
std::string OpenBlasCoreName();

// When OpenBLAS chose GEMM kernels older than the processor can run (its own detection does
// not know the model, as on some VMs: Prescott's SSE3 kernels on an AVX-512 processor run
// about 3x slower), the OPENBLAS_CORETYPE that selects the processor's kernels: "SkylakeX" for
// AVX-512 F/BW/DQ/VL, "Haswell" for AVX2 with FMA. Empty when the kernels fit, or the
// /proc/cpuinfo text has no flags. `core` is OpenBlasCoreName().
std::string BetterBlasCoreType(absl::string_view cpuinfo, absl::string_view core);

// BetterBlasCoreType for this process's processor and OpenBLAS.
std::string BetterBlasCoreType();

// A warning for when BetterBlasCoreType names a core type: which kernels run on what and why
// (OpenBLAS did not know the model; or `env_coretype`, OPENBLAS_CORETYPE's value when set, asked
// for them, or for others OpenBLAS does not have), and what selects the faster ones. Empty when
// it names none.
std::string BlasCoreAdvice(absl::string_view cpuinfo, absl::string_view core,
                           const char* env_coretype = nullptr);

// BlasCoreAdvice for this process's processor, OpenBLAS and environment.
std::string BlasCoreAdvice();

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_DEVICE_NAME_H_
