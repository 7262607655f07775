// One chunk's partial of a tile (step 2 of flash_attention.hpp's fixed
// reduction order) and what it needs of the tile: its query rows gathered
// and prepared for its products' kernels. run_tiles (run_tiles.cpp) merges
// the partials; flash_attention.cpp packs user K and V and builds the tiles.
#pragma once

#include <cstddef>

#include "engine/attention/flash_attention.hpp"
#include "kvhead/config.hpp"

namespace kvhead::engine {

/// Which kernels run q kᵀ and p v, for K/V stored as `element`:
///   bf16  the bf16 unit's products (gemm_bf16_paged: q and p rounded to bf16
///         as the kernel reads them, fp32 sums), in bf16 precision and over a
///         bf16 KV cache in either precision (its K and V are bf16 already),
///         where the paged kernels run and are chosen (amx: in bf16
///         precision; else the kernel configuration's choice,
///         bf16_paged_products_chosen);
///   int8  the int8 paged kernels (gemm_int8_paged: q quantized to int8 per
///         row where the kernels take int8 A, else to int16, p to int16,
///         exact integer sums), over an int8 KV cache where they run;
///   fp32  the fp32 kernels over the (rounded or widened) values otherwise.
/// Decided by the problem alone (precision, path, element type, head_dim), so
/// every tile, chunk and row of it, prefill or decode, takes the same one.
enum class product_kind { fp32, bf16, int8 };
product_kind attention_products(kvhead::precision precision, simd_path path, kv_dtype element, std::size_t head_dim);

/// True when the first `rows` rows of a packed V (k x n) are finite (int8:
/// always; its non-finite rows have a NaN scale instead).
bool all_finite(const packed_b_view& values, std::size_t rows);

/// A partial of every row of a tile: max [rows], sum [rows], then acc [rows x d].
inline std::size_t partial_floats(const attention_tile& tile) {
  return tile.positions * tile.group * (tile.head_dim + 2);
}

/// Floats of the tile's query rows as prepare_queries stores them over K/V
/// stored as `element` (0 where the fp32 kernels run: they read the rows).
std::size_t prepared_query_floats(const attention_tile& tile, kv_dtype element);

/// The tile's query rows, stacked: row i * R + r is position i of head r of
/// the group; in bf16 precision rounded to bf16 as they are gathered (the
/// queries' one rounding: scaled_dot_product leaves them as they came).
void gather_queries(const attention_tile& tile, float* q_rows);

/// Where the bf16 or int8 products run, the tile's query rows converted to
/// bf16 rows or quantized once into `storage` (prepared_query_floats), for
/// every chunk's q kᵀ: per chunk, the int8 quantization and its scratch lease
/// took 3.8% and 2.5% of a decode step's samples over an int8 cache (Xeon,
/// S1's geometry, perf); the bf16 conversion about 2% of a bf16 prefill
/// (S2_prefill_gqa_causal_bf16).
void prepare_queries(const attention_tile& tile, const kv_chunk_source& source, const float* q_rows, float* storage);

/// Step 2: chunk `chunk`'s partial of every row into `partial` (max, sum,
/// acc: partial_floats), over `scores` (rows x kv_chunk floats of scratch).
/// Rows that see no key of the chunk are left as they are (never merged). The
/// chunk's keys come in segments read in place (one per KV cache block);
/// every element's sums run in the same order whatever the segment size.
/// Segments before the first key any row sees (the tile's first row's window
/// begin) are neither asked for nor read.
/// q_prepared: the rows prepare_queries made of q_rows (read where the
/// bf16 or int8 products run).
void chunk_partial(const attention_tile& tile, const kv_chunk_source& source, std::size_t chunk, const float* q_rows,
                   const float* q_prepared, float* scores, float* partial);

}  // namespace kvhead::engine
