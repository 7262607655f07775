#include "engine/gemm/blocking.hpp"

namespace kvhead::engine {
namespace {

template <class Arch, class Shapes>
struct tile_lookup;

template <class Arch, class... Shapes>
struct tile_lookup<Arch, std::tuple<Shapes...>> {
  static constexpr bool compiled(std::size_t mr, std::size_t nr) {
    return ((Shapes::mr == mr && Shapes::nr == nr) || ...);
  }
  enum class kind { panel, wide, half };  // microkernels, wide_microkernels, half_microkernels
  // The tile's kernels of `which` kind for B stored as `element`.
  template <class Kernels>
  static const microkernel_function* of(kind which, kv_dtype element) {
    return which == kind::wide   ? Kernels::wide_microkernels(element)
           : which == kind::half ? Kernels::half_microkernels(element)
                                 : Kernels::microkernels(element);
  }
  static const microkernel_function* kernels(std::size_t mr, std::size_t nr, kv_dtype element, kind which) {
    const microkernel_function* found = nullptr;
    ((found = found == nullptr && Shapes::mr == mr && Shapes::nr == nr
                  ? of<gemm_kernels<Arch, Shapes::mr, Shapes::nr>>(which, element)
                  : found),
     ...);
    return found;
  }
  static std::array<const microkernel_function*, stored_dtype_count> by_element(std::size_t mr, std::size_t nr,
                                                                                kind which) {
    return {kernels(mr, nr, kv_dtype::f32, which), kernels(mr, nr, kv_dtype::bf16, which),
            kernels(mr, nr, kv_dtype::f16, which), kernels(mr, nr, kv_dtype::int8, which)};
  }
};

template <class Arch>
using tiles_of = tile_lookup<Arch, typename compiled_tiles<Arch>::shapes>;

constexpr bool every_row_is_compiled() {
  for (const kernel_config_row& row : kernel_config_rows) {
    const bool compiled = row.path == simd_path::avx512 ? tiles_of<avx512_arch>::compiled(row.mr, row.nr)
                          : row.path == simd_path::avx2 ? tiles_of<avx2_arch>::compiled(row.mr, row.nr)
                                                        : tiles_of<sse2_arch>::compiled(row.mr, row.nr);
    if (!compiled) return false;
  }
  return true;
}

static_assert(every_row_is_compiled(), "a kernel_config row names a register tile no engine/arch TU compiles");

}  // namespace

namespace {

// The fp32 GEMM's paged prefetch distances under a single A panel, per stored element type (f32 read as
// stored, the others widened).
std::array<stream_prefetch, stored_dtype_count> paged_prefetch(const kernel_config_row& row) {
  std::array<stream_prefetch, stored_dtype_count> by_element;
  for (std::size_t element = 0; element < stored_dtype_count; ++element) {
    const auto stored = static_cast<kv_dtype>(element);
    const std::size_t l1_bytes =
        stored == kv_dtype::f32 ? row.fp32_paged_prefetch_bytes : row.widened_paged_prefetch_bytes;
    by_element[element] = paged_stream_prefetch(row, l1_bytes, true, stored);
  }
  return by_element;
}

gemm_config resolve(simd_path path) {
  const kernel_config& machine = kernel_config_for(path);
  return dispatch(path, [&](auto arch) {
    using Arch = decltype(arch);
    return gemm_config{machine.mr,
                       machine.nr,
                       machine.mc,
                       machine.kc,
                       machine.nc,
                       tiles_of<Arch>::by_element(machine.mr, machine.nr, tiles_of<Arch>::kind::panel),
                       tiles_of<Arch>::by_element(machine.mr, machine.nr, tiles_of<Arch>::kind::wide),
                       tiles_of<Arch>::by_element(machine.mr, machine.nr, tiles_of<Arch>::kind::half),
                       row_stream_kernels<Arch>::row_streams(),
                       paged_prefetch(*machine.row),
                       machine.row->fp32_paged_prefetch_to_l2,
                       machine.row->a_in_place_panels,
                       machine.b_sweep_panels};
  });
}

// Resolved once per path (a decode step asks once per chunk); a throw (a bad
// KVHEAD_CONFIG) leaves the path unresolved, to throw again.
template <simd_path Path>
const gemm_config& resolved() {
  static const gemm_config config = resolve(Path);
  return config;
}

}  // namespace

const gemm_config& gemm_config_for(simd_path path) {
  return path == simd_path::avx512 ? resolved<simd_path::avx512>()
         : path == simd_path::avx2 ? resolved<simd_path::avx2>()
                                   : resolved<simd_path::sse2>();
}

}  // namespace kvhead::engine
