// Which bf16 unit runs (gemm_bf16.hpp): CPUID and XCR0 (engine/arch/
// bf16_support.hpp), for AMX the Linux permission to use the tile state,
// then a one-time self-test of each unit's kernels against their scalar
// emulation (bf16_emulation.hpp), under a SIGILL/SIGSEGV guard: virtual
// machines exist that advertise AMX and then fault. Any refusal falls back
// to the next unit, with the reason kept for `kvhead kernels`.
#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/arch/bf16_support.hpp"
#include "engine/gemm/bf16_emulation.hpp"
#include "engine/gemm/gemm_bf16.hpp"

namespace kvhead::engine {
namespace {

// Linux (arch/x86/include/uapi/asm/prctl.h, asm/fpu/xstate.h).
constexpr int arch_req_xcomp_perm = 0x1023;
constexpr int xfeature_xtiledata = 18;

sigjmp_buf self_test_escape;
void escape_from_fault(int) { siglongjmp(self_test_escape, 1); }

// Runs run(context) on this thread; false when it raised SIGILL or SIGSEGV.
// The run is then abandoned without unwinding its frames: the driver owns no
// heap memory there, only a scratch lease, whose level stays taken on this
// thread (one buffer, kept until exit). A frame of plain data only, so that
// nothing here lives across the jump.
[[gnu::noinline]] bool runs_without_fault(void (*run)(void*), void* context) {
  struct sigaction guard {
  }, old_ill{}, old_segv{};
  guard.sa_handler = escape_from_fault;
  sigemptyset(&guard.sa_mask);
  sigaction(SIGILL, &guard, &old_ill);
  sigaction(SIGSEGV, &guard, &old_segv);
  volatile bool faulted = false;
  if (sigsetjmp(self_test_escape, 1) == 0)
    run(context);
  else
    faulted = true;
  sigaction(SIGILL, &old_ill, nullptr);
  sigaction(SIGSEGV, &old_segv, nullptr);
  return !faulted;
}

}  // namespace

// Exact sums (small integers: any order gives the same bits), every edge of
// the driver (row and column remainders, a partial pair step) and, with 1
// row, the skinny kernels. Runs on this thread only.
std::string bf16_self_test(const bf16_kernels& kernels) {
  const std::size_t rows = kernels.mr + 3, n = bf16_nr * (kernels.skinny_panels + 1) + 9, k = 2 * 16 + 7;
  std::vector<float> a(rows * k), b(k * n), hardware(rows * n), emulated(rows * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 9) - 4);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 11) - 5);
  const packed_bf16_b packed(k, n, gemm_operand{b.data(), n, transpose::no}, kernels.unit);
  const gemm_serial_scope serial;  // the fault guard covers this thread only
  for (const std::size_t m : {std::size_t{1}, rows}) {
    struct hardware_run {
      const bf16_kernels& kernels;
      gemm_shape shape;
      const float* a;
      const packed_bf16_b& b;
      float* c;
    } run{kernels, {m, n, k}, a.data(), packed, hardware.data()};
    const bool ran = runs_without_fault(
        [](void* context) {
          const hardware_run& r = *static_cast<const hardware_run*>(context);
          gemm_bf16_with(r.kernels, r.shape, {r.a, r.shape.k, transpose::no}, r.b, 0.0f, r.c, r.shape.n);
        },
        &run);
    if (!ran) return "its self-test faulted (SIGILL or SIGSEGV)";
    gemm_bf16_with(emulated_bf16_kernels(kernels.unit), {m, n, k}, {a.data(), k, transpose::no}, packed, 0.0f,
                   emulated.data(), n);
    if (std::memcmp(hardware.data(), emulated.data(), m * n * sizeof(float)) != 0)
      return "its self-test gave other results than the emulation";
  }
  return {};
}

namespace {

// Why `unit` cannot run here ("" when it can), decided once per unit.
std::string refusal(bf16_unit unit) {
  const bf16_hardware& hardware = host_bf16_hardware();
  switch (unit) {
    case bf16_unit::amx: {
      if (!hardware.amx_missing.empty()) return hardware.amx_missing;
      if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0)
        return std::string("Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
               std::strerror(errno) + ")";
      return bf16_self_test(amx_kernels());
    }
    case bf16_unit::avx512bf16:
      if (!hardware.avx512bf16_missing.empty()) return hardware.avx512bf16_missing;
      return bf16_self_test(avx512bf16_kernels());
    case bf16_unit::fp32_fallback:
      break;
  }
  return {};
}

const std::string& cached_refusal(bf16_unit unit) {
  static const std::string amx = refusal(bf16_unit::amx);
  static const std::string avx512bf16 = refusal(bf16_unit::avx512bf16);
  static const std::string none;
  return unit == bf16_unit::amx ? amx : unit == bf16_unit::avx512bf16 ? avx512bf16 : none;
}

struct bf16_choice {
  bf16_unit unit;
  std::string reason;
};

bf16_choice choose() {
  const bf16_isa_request request = bf16_request_from_isa_variable();
  if (request.limit == bf16_isa_limit::fp32_fallback) {
    const char* isa = std::getenv("KVHEAD_ISA");
    const char* config = std::getenv("KVHEAD_CONFIG");  // what lowered the path when KVHEAD_ISA did not
    return {bf16_unit::fp32_fallback, isa != nullptr && *isa != '\0'
                                          ? std::string("KVHEAD_ISA=") + isa + " limits bf16 to the fp32 fallback"
                                          : std::string("KVHEAD_CONFIG=") + (config != nullptr ? config : "") +
                                                " sets the SIMD path " + to_string(active_simd_path()) +
                                                ", which has no bf16 unit: the fp32 fallback, as on its CPUs"};
  }
  std::string reason;
  for (bf16_unit unit : {bf16_unit::amx, bf16_unit::avx512bf16}) {
    if (unit == bf16_unit::amx && request.limit != bf16_isa_limit::amx) {
      reason = "KVHEAD_ISA=avx512bf16 leaves out amx";
      continue;
    }
    const std::string& refused = cached_refusal(unit);
    if (refused.empty()) return {unit, reason};
    if (request.named)
      throw std::runtime_error(std::string("KVHEAD_ISA=") + to_string(unit) + ": the bf16 unit cannot run: " + refused);
    reason += (reason.empty() ? "" : "; ") + std::string(to_string(unit)) + ": " + refused;
  }
  return {bf16_unit::fp32_fallback, reason};
}

const bf16_choice& chosen() {
  static const bf16_choice choice = choose();  // retried if it threw
  return choice;
}

}  // namespace

const char* to_string(bf16_unit unit) {
  switch (unit) {
    case bf16_unit::amx:
      return "amx";
    case bf16_unit::avx512bf16:
      return "avx512bf16";
    case bf16_unit::fp32_fallback:
      return "fp32_fallback";
  }
  return "unknown";
}

bool bf16_unit_runs_here(bf16_unit unit) { return cached_refusal(unit).empty(); }

const std::string& bf16_unit_refusal(bf16_unit unit) { return cached_refusal(unit); }

bf16_unit active_bf16_unit() { return chosen().unit; }

const std::string& bf16_unit_reason() { return chosen().reason; }

}  // namespace kvhead::engine
