// Tiled (flash-style) attention over already-projected Q, K, V.
//
// Shapes: Q and O [batch, H, q_len, d], K and V [batch, G, kv_len, d], each
// a head_tensor (any strides, head_dim contiguous). Query head h reads kv head
// h / (H / G).
//
// Work unit: (batch b, kv head g, query tile). The R = H / G query heads of the
// group are stacked as extra rows (row = position * R + head in group), so every
// K/V tile is streamed once per group, not once per query head.
//
// Fixed reduction order (every path — prefill, decode, split-KV decode —
// follows it, so results are bit-identical however the work is cut):
//   1. The key axis is cut into chunks at fixed absolute positions
//      [c * kv_chunk, (c + 1) * kv_chunk).
//   2. Each chunk yields, per query row, a partial (max, sum, accumulator):
//        s = scale * q kᵀ                            GEMM, one element per (row, key)
//        s = cap * tanh(s / cap)                     soft-capping, when configured
//        s += additive mask                          when given
//        (max, sum), p = online_softmax_block over the row's visible keys of
//                        the chunk [begin, end), from an empty state
//        acc = p v over those visible keys           GEMM, one FMA chain per
//                        element from +0 in key order; keys before `begin`
//                        that the GEMM spans get p = 0 and a finite v (the
//                        row's own or zeros), which leave acc at +0 exactly
//        (bf16 precision: p rounded to bf16 before p v, per element; where
//        gemm_bf16_paged runs, in bf16 precision and over a bf16 KV cache
//        in either precision, q kᵀ and p v are its bf16 products, in pairs
//        of head_dim and of keys from even positions of the chunk — p v
//        always starts at a segment's first key, V packed — so the order
//        per element is again the same for any cut)
//      The GEMM does the same arithmetic per element for one row as for many
//      (engine/gemm/gemm.hpp), and the softmax kernels are per row.
//   3. Partials are merged left to right, starting from the empty partial
//      (merge_partials), and the row is normalized once at the end, where an
//      attention sink, when configured, joins the denominator
//      (normalize_row_with_sink): after the fixed merge, so it cannot depend
//      on how the keys were cut.
// Chunks with no visible key for any row of the tile are skipped (merging an
// empty partial changes nothing), and never read: with a sliding window the
// chunks (and, over a cache, the blocks) wholly before every row's window.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/gemm/gemm.hpp"
#include "engine/scheduler/split_schedule.hpp"
#include "kvhead/attention.hpp"
#include "kvhead/config.hpp"

namespace kvhead::engine {

/// Keys per chunk: the fixed reduction unit above. 120 stacked rows x 256
/// keys of scores is 120 KiB, in L2 with the chunk's K and V; fewer keys per
/// chunk cost more merges and shorter GEMMs. At most KC on every path, so
/// P·V over one chunk is one KC block: one chain of FMAs per element however
/// the chunk's keys are cut into segments (gemm over a paged_b_view).
inline constexpr std::size_t kv_chunk = 256;
static_assert(kv_chunk <= gemm_kc, "a chunk's P·V must be one KC-deep block (one FMA chain per element)");

/// The most segments a chunk may be cut into (segment_keys() >= kv_chunk / this).
inline constexpr std::size_t max_segments_per_chunk = 16;

/// int8 scales come in cache lines of this many (kv_segment).
inline constexpr std::size_t scale_line_floats = 64 / sizeof(float);

/// Keys [k0, k0 + n) of one chunk of one (sequence, kv head) stored together
/// (one KV cache block, or a whole chunk of user K/V), as GEMM B operands
/// read in place: keys = Kᵀ packed (head_dim x n' >= n), V packed (`values`,
/// k' >= n rows of head_dim) or, when values_in_place.data is set (fp32
/// user V only), read where it is (row j at data + j * ld). Packed operands
/// may hold bf16, f16 or int8 elements (packed_b_view::element), widened in
/// the micro-kernel. int8 only: key_scales[j] and value_scales[j], key j's
/// fp32 scales, which the kernel applies to key j's scores and to its
/// probabilities, readable up to the segment's keys rounded up to whole
/// lines of scale_line_floats; null otherwise. The GEMM gives the same bits
/// for either form of V (gemm.hpp), and for one or several segments
/// (paged_b_view).
struct kv_segment {
  packed_b_view keys, values;
  gemm_operand values_in_place;
  const float* key_scales = nullptr;
  const float* value_scales = nullptr;
  /// True when every row of `values` is known to be finite (checked once
  /// as the source packed them); false: unknown, the kernel checks.
  bool values_finite = false;
  /// Nonzero: `keys` (fewer columns than the path's NR) is one narrow panel
  /// of this row stride (paged_b_view::narrow_row_stride); 0: NR-wide panels.
  std::size_t key_row_stride = 0;
};

/// Supplies the chunks of one (sequence, kv head): user K/V (flash_attention),
/// or the blocks of a KV cache, each chunk as kv_chunk / segment_keys()
/// segments read in place.
class kv_chunk_source {
 public:
  virtual ~kv_chunk_source() = default;
  /// Keys per segment: a divisor of kv_chunk, at least kv_chunk / max_segments_per_chunk.
  virtual std::size_t segment_keys() const = 0;
  /// Segments [first, end) of chunk `chunk` into views[first, end): segment s
  /// holds keys [chunk * kv_chunk + s * segment_keys(), ...). One call per
  /// chunk, not per segment: at 16-token blocks a virtual call and two
  /// out-of-line address computations per segment cost a decode step about
  /// 3% (Zen 3, bf16 and int8 caches, 3 alternations).
  virtual void segments(std::size_t chunk, std::size_t first, std::size_t end, kv_segment* views) const = 0;
  /// The element type of every segment's K and V.
  virtual kv_dtype element() const = 0;
};

/// The layer's variants of the scores and the softmax (attention.hpp), all
/// off by default: soft-capping (Gemma 2), attention sinks (gpt-oss), ALiBi.
struct score_variants {
  float logit_softcap = 0.0f;           // > 0: s = cap * tanh(s / cap) after the scale, before the mask; 0: none
  const float* sinks = nullptr;         // [H] finite logits, query head h's at sinks[h]; null: none
  const float* alibi_slopes = nullptr;  // [H] finite slopes: s += slope_h (j - position) after the cap; null: none
};

/// One unit of work: query rows [position0, position0 + positions) of the R
/// query heads of kv head `kv_head`, for one sequence.
struct attention_tile {
  const float* q;  // query head h, row i at q + h * q_head_stride + i * q_seq_stride
  std::size_t q_head_stride, q_seq_stride;
  float* out;  // same indexing as q
  std::size_t out_head_stride, out_seq_stride;
  std::size_t kv_head, group, head_dim;  // group = R = H / G
  std::size_t position0, positions;
  std::size_t q_offset;   // absolute position of query row 0
  std::size_t key_limit;  // keys [0, key_limit) exist (valid_len)
  bool causal;
  const float* additive_mask;  // row i, key j at additive_mask[i * mask_ld + j]; null: none
  std::size_t mask_ld;
  float scale;
  simd_path path;
  std::size_t window = 0;  // sliding window W: 0 none, else keys j > position - W only
  score_variants variants{};
  /// bf16: each query row rounded to bf16 as the tile gathers it, each
  /// probability before p v (the row's sum and max stay those of the fp32
  /// softmax); user K and V rounded as flash_attention packs them, a KV
  /// cache's as they were written (the layer writes rounded ones).
  kvhead::precision precision = kvhead::precision::f32;
  /// bf16 precision: q holds bf16 values already (attention_problem::inputs_rounded).
  bool queries_rounded = false;

  /// Keys [visible_begin(i), visible_end(i)) are visible to query row i
  /// (before the additive mask); none when begin >= end.
  std::size_t visible_begin(std::size_t row) const;
  std::size_t visible_end(std::size_t row) const;
};

/// Query positions per tile for a group of R heads on `path`: R x positions
/// <= the configuration's attention_rows (engine/arch/kernel_config.hpp), at
/// least 1. Only cuts the work: results do not depend on it.
std::size_t tile_positions(std::size_t group, simd_path path);

/// The chunks [first, end) of a tile that hold a key some row sees (first
/// == end: none).
struct chunk_range {
  std::size_t first, end;
};
chunk_range tile_chunks(const attention_tile& tile);

/// The scheduler's view of tiles: per tile, its visible key chunks (a unit's
/// chunk u is the tile's chunk tile_chunks(tile).first + u) and the
/// multiply-adds of q kᵀ and p v over its visible keys.
void tile_work_units(const std::vector<attention_tile>& tiles, std::vector<work_unit>& units);

/// Runs every tile in parallel as the scheduler plans them
/// (engine/scheduler/split_schedule.hpp): long key ranges are split across
/// tasks, their chunk partials merged afterwards in chunk order, so the bits
/// are the same whatever the thread count. sources[t] is tile t's chunk
/// source. Steady-state calls allocate nothing (per-thread reused storage).
void run_tiles(const std::vector<attention_tile>& tiles, const std::vector<const kv_chunk_source*>& sources);

/// A validated attention problem over user tensors (validated at the public
/// boundary).
struct attention_problem {
  attention_dims dims;
  head_tensor<const float> q, k, v;
  head_tensor<float> out;
  float scale;
  bool causal;
  std::size_t q_offset;
  const std::size_t* valid_len;  // null: kv_len
  const float* additive_mask;    // [q_len, kv_len] or null
  simd_path path;
  std::size_t window = 0;  // sliding window, 0: none (attention_options::sliding_window)
  score_variants variants{};
  kvhead::precision precision = kvhead::precision::f32;  // attention_tile::precision
  // bf16 precision: q, k and v hold bf16 values already (a layer rounds its
  // projections), so they are read as they are instead of rounded again
  // (rounding a bf16 value to bf16 changes nothing: the same results).
  bool inputs_rounded = false;
};

/// Packs Kᵀ once per (batch, kv head, chunk) into the calling thread's
/// reused scratch; reads V in place when each (batch, kv head) has one query
/// tile (and bf16's products do not run: they read V packed), else packs it
/// likewise (bf16 precision, several query tiles per kv head, the bf16
/// products running: both as bf16, in the tiles' pair layout on amx tiles,
/// pack_tile_pairs, else as bf16 panels); then runs every
/// (batch, kv head, query tile) in parallel on the caller's task arena. Steady-state calls of one shape
/// allocate nothing. K and V rows must not overlap (seq_stride >= head_dim).
void flash_attention(const attention_problem& problem);

/// The materialized probabilities [batch, H, q_len, kv_len] (row softmax of
/// the full score rows; rows with no visible key are zeros).
void attention_probabilities(const attention_problem& problem, float* probabilities);

}  // namespace kvhead::engine
