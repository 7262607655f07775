// kvhead: library-wide configuration — version and the SIMD path in use.
//
// kvhead picks its SIMD path once, at the first call that needs it:
//   avx512  AVX-512 F/CD/DQ/BW (xsimd::avx512bw), when the CPU has it AND the
//           OS saves the AVX-512 register state (XCR0), so a host that hides
//           AVX-512 never gets SIGILL;
//   avx2    AVX2 + FMA + F16C (xsimd::fma3<xsimd::avx2>);
//   sse2    the portable fallback every x86-64 CPU runs.
// The environment variable KVHEAD_ISA=avx512|avx2|sse2 forces a lower path (to
// test a path end to end, or to reproduce results across machines). Asking for
// a path this CPU cannot run, or for an unknown name, is an error: the call
// that needs the path throws std::runtime_error naming the problem.
//
// bf16 GEMMs (bf16 precision) run on the best bf16 unit that works: AMX-BF16
// tiles, else AVX512-BF16 (vdpbf16ps), else the fp32 kernels of the SIMD path
// on bf16-rounded inputs; AMX is used only after the OS grants its tile state
// and a one-time self-test passes (`kvhead kernels` says why a unit is not
// used). KVHEAD_ISA's two levels above avx512 name a unit:
//   amx         AMX-BF16 (with the avx512 path for fp32 work);
//   avx512bf16  AVX512-BF16, never AMX (with the avx512 path);
// the fp32 levels (avx512, avx2, sse2) leave bf16 GEMMs on the fp32 fallback of
// that path. Asking for a unit this CPU, its OS or the self-test refuses is an
// error, as for a path. Each unit sums in its own order: results are
// bit-identical on one machine for one unit, not across units.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kvhead/export.h"

namespace kvhead {

/// Library version, "major.minor.patch".
KVHEAD_API const char* version();

/// The SIMD instruction-set paths kvhead is compiled for, best first.
enum class simd_path { avx512, avx2, sse2 };

/// "avx512", "avx2" or "sse2".
KVHEAD_API const char* to_string(simd_path path);

/// How a KV cache stores keys and values (kv_cache.hpp, "Element types"):
/// fp32, bfloat16, IEEE half, or symmetric int8 with one fp32 scale per token.
enum class kv_dtype { f32, bf16, f16, int8 };

/// "f32", "bf16", "f16" or "int8".
KVHEAD_API const char* to_string(kv_dtype dtype);

/// How an attention_layer computes (attention.hpp, attention_config::precision):
/// f32 throughout, or bf16 weights and GEMM inputs with fp32 accumulation.
enum class precision { f32, bf16 };

/// "f32" or "bf16".
KVHEAD_API const char* to_string(precision value);

/// The path kvhead uses (best supported, or KVHEAD_ISA; avx512 for
/// KVHEAD_ISA=amx or avx512bf16). Throws std::runtime_error when KVHEAD_ISA
/// is unknown or above what the CPU runs.
KVHEAD_API simd_path active_simd_path();

/// Every path this CPU and OS can run, best first (sse2 is always last).
KVHEAD_API std::vector<simd_path> supported_simd_paths();

/// The kernel configuration in use: a row of kvhead's table of configurations
/// (GEMM register tile and cache blocking per kind of CPU), chosen at first use
/// from what CPUID reports — vendor, family, caches — for the active path.
/// `kvhead kernels` prints the table, the choice and the reasons. The
/// environment variable KVHEAD_CONFIG=<name> forces a row (its SIMD path then
/// becomes the active one; KVHEAD_ISA, if also set, must agree; an unknown
/// name or a path this CPU cannot run is an error, as for KVHEAD_ISA).
/// In fp32 (f32 precision over f32, f16 and int8 caches) results depend on
/// the SIMD path only, never on the configuration: every row sums over k in
/// the same fixed blocks, so two CPUs of different kinds give the same bits on
/// the same path (different paths round differently). bf16 precision and bf16
/// caches also depend on the bf16 unit and on whether the row puts attention's
/// bf16 products on it (README, "Determinism"): KVHEAD_CONFIG and KVHEAD_ISA
/// reproduce another CPU's choice.
KVHEAD_API const char* kernel_config_name();

/// Threads for kvhead's work. 0 (the default): every call runs in the
/// caller's oneTBB task arena — all cores unless the caller made a smaller
/// arena. n > 0: every call runs in a process-wide task arena of n threads,
/// at most as many as the CPUs this process may use (more would not run:
/// the arena is capped there; num_threads() returns n, the setting).
/// Nothing in kvhead starts threads of its own either way. Results never
/// depend on the thread count. Throws std::invalid_argument above 4096.
KVHEAD_API void set_num_threads(std::size_t threads);
KVHEAD_API std::size_t num_threads();

/// Frees kvhead's per-thread scratch memory (GEMM packing buffers, Q/K/V and
/// attention workspaces) on every thread of the process, except what a
/// kvhead call running at that moment is using. Each thread keeps its scratch
/// between calls, so that steady-state calls allocate nothing; it grows to
/// the largest call that thread has run (an 8k-token prefill leaves hundreds
/// of MB per thread). Call this after such a one-off call. It may be called
/// at any time from any thread, also while other threads run kvhead calls:
/// those keep what they use, and the next calls allocate their scratch again
/// (once). Packed weights and KV caches are not scratch: they belong to their
/// attention_layer and kv_cache. Never throws.
KVHEAD_API void release_scratch() noexcept;

/// How attention reduces a key range that the scheduler splits across tasks
/// (long pasts decoded for few sequences).
///   fixed    (default) every 256-key chunk's partial is merged left to right,
///            so results are bit-identical for any thread count, chunking of
///            the tokens or batching of the sequences.
///   fastest  each task first merges its own chunks, then the tasks' results
///            are merged: less memory traffic (measured about 3% faster on
///            S4_decode_mqa at 2 threads, median of 6 runs; within noise on
///            the other shapes), but the last bits of a result may change with
///            the thread count.
/// Process-wide; the environment variable KVHEAD_REDUCTION=fixed|fastest sets
/// the initial value (anything else is an error at first use, like KVHEAD_ISA).
/// set_reduction_order throws std::invalid_argument for a value that is
/// neither (an integer cast to the enum), changing nothing.
enum class reduction_order { fixed, fastest };
KVHEAD_API void set_reduction_order(reduction_order order);
KVHEAD_API reduction_order current_reduction_order();

}  // namespace kvhead
