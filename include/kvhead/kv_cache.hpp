// kvhead: a paged key/value cache for incremental decoding.
//
// Pages. The cache owns one pool of fixed-size blocks, allocated once at
// construction from a byte budget (as many whole blocks as fit). A block holds
// block_size consecutive token positions of one sequence, for every layer and
// every kv head. A sequence is a block table (block indices into the pool) and
// a length: token position p lives in block table[p / block_size], slot
// p % block_size. Several layers of one geometry share one sequence-id space,
// so one append() reserves a token for all of them.
//
// Element types (kv_cache_config::dtype, fixed at creation). K and V are
// converted once, when a token is written into its block, and read in place
// by the attention kernels, which widen them to fp32 in registers (no
// dequantized copy); scores, softmax, accumulation and the merge stay fp32.
// Over a bf16 cache, on CPUs with AVX512-BF16 (AMD Zen 4, Intel from Cooper
// Lake, except the Xeons with AMX, whose vdpbf16ps runs at half their FMA
// rate; `kvhead kernels` prints it), q kᵀ and p v instead run on vdpbf16ps
// whatever the layer's precision (on the Xeons with AMX: on AMX tiles in
// bf16 precision, the fp32 kernels in f32): q and the unnormalized
// probabilities are rounded to bf16 as the kernel reads them (nearest even;
// the softmax's sum stays that of the unrounded ones), products and sums in
// fp32 (in pairs of terms, or tiles of 32 on AMX; subnormal bf16 inputs
// read as zero). That halves the instructions
// per cached byte, which decode's speed depends on; it adds a rounding of q
// and of p of the same size as the rounding of K and V (the accuracy below is
// measured with it). Over an int8 cache, on CPUs with AVX512-VNNI and
// AVX512-VBMI (Zen 4, Intel from Ice Lake; not when KVHEAD_ISA names avx512
// or lower), q kᵀ runs on vpdpbusd and p v on vpdpwssd: each row of q is
// quantized to int8 by its own scale (max |x| / 127, nearest even: at most
// 2^-8 of the row's largest element off, the order of K's own rounding),
// each row of the probabilities times V's scales to int16 (max |x| / 32767:
// 2^-16; at 8 bits the many small probabilities of a long context would
// vanish), and the products with the stored int8 are summed exactly in
// int32, then scaled in fp32. On the avx2 path (AVX2 CPUs without
// AVX-512, or KVHEAD_ISA=avx2) both run on vpmaddwd, q quantized to int16
// as well (2^-16 of its row's largest element: AVX2 has no exact int8
// product), with the same exact int32 sums. Elsewhere (the sse2 path, and
// avx512 without AVX512-VNNI), and for f16, fp32 arithmetic over the
// widened values.
//   f32   4 bytes per element, stored as given.
//   bf16  2 bytes: fp32 rounded to nearest even (8 bits of mantissa). NaN stays
//         NaN (quiet), +-Inf stays +-Inf; finite values too large round to
//         +-Inf as IEEE rounding does (above ~3.39e38).
//   f16   2 bytes, IEEE binary16: rounded to nearest even, subnormals kept.
//         NaN stays NaN, +-Inf stays +-Inf, and finite values of magnitude
//         65520 or more become +-Inf (f16's range is +-65504).
//   int8  1 byte: symmetric, one fp32 scale per token and kv head, for K and
//         for V separately: scale = max|x| / 127 over the row's head_dim
//         values (fp32 division; one ulp less where 127 * scale would
//         overflow: a max of FLT_MAX still reads back finite),
//         q = x / scale (fp32 division) rounded to
//         nearest even, in [-127, 127]; an all-zero row has scale 0 and
//         stores zeros. A row holding a NaN or an Inf is stored with a NaN
//         scale (and zeros), so every output attending to that token is NaN,
//         never a silent finite value. The kernels fold K's scale into each
//         key's scores and V's scale into each key's probabilities.
// Accuracy (layer output against the same layer over an f32 cache, max
// |difference| / max |f32 output|, random layers with past >= 1000 and
// head_dim 128, tests/kv_dtype_test.cpp, which derives a bound from each
// dtype's rounding): bf16 <= 1e-2, f16 <= 2e-3, int8 <= 3e-2; measured on a
// random layer at past 1024-1039: bf16 1.1e-3 on the fp32 kernels, 2.6e-3 on
// vdpbf16ps (Zen 4), f16 1.5e-4, int8 4.2e-3 on the fp32 kernels and on
// avx2's int16 products, 9.1e-3 on the AVX512-VNNI products (q's int8
// rounding adds to K's).
// Those bounds hold for such data: scores of standard deviation about 1,
// every head dim of K alike. The rounding error of a score grows with
// |q| |k| and, for int8, with the largest element of each token's K row (its
// scale), so data unlike that goes further (measured, head_dim 128, past
// 1024, on vdpbf16ps and VNNI, an independent float64 reference): scores of
// standard deviation 10: bf16 1.9e-2, f16 3.3e-3, int8 5.9e-2; four K
// dimensions 10x the others (the outlier channels of real K caches): bf16
// 1.0-1.8e-2, f16 2.5e-3, int8 6-9e-2 (0.2 at head_dim 256); keys sharing an
// offset 10x their spread: bf16 3.3e-2, f16 4.3e-3, int8 0.19 (at 100x: 0.36,
// 5.7e-2, 1.0). The f32 cache stays within 4e-5 of float64 on all of them:
// choose f16 or f32 for such data, or check a model's own outputs
// (`kvhead demo --kv-dtype all` prints the difference of each dtype).
// Results stay bit-identical across thread counts, chunking of the tokens,
// batching and block sizes for each dtype and SIMD path (and, over bf16, the
// kernels the configuration puts its products on: config.hpp).
//
// Block layout (fixed; the attention kernels depend on it). With E the
// element size (4, 2, 2, 1 bytes), region_elements = max(head_dim *
// block_size, block_size * round_up(head_dim, 32)) and
// region_bytes = round_up(region_elements * E, 64) (+ round_up(4 *
// block_size, 64) for int8: the block's fp32 scales, one per token), a block
// is R = 2 * num_layers * num_kv_heads regions of region_bytes, region
// r = (l * num_kv_heads + h) * 2 + (0 for K, 1 for V) for layer l and kv
// head h. block_bytes() = R * region_bytes (kv_cache_block_bytes computes it
// from a configuration). The pool stores blocks in groups of G = 256 /
// block_size consecutive indices (the last group may hold fewer, n); group
// g starts at byte g * G * block_bytes and holds, for r = 0 .. R - 1, region r
// of each of its blocks side by side: region r of block b starts at byte
// g * G * block_bytes + (r * n + b - g * G) * region_bytes. A sequence's
// table entry p takes a free block whose place in its group, b - g * G, is
// p % G where one is free (of those, the lowest index in a fresh cache, the
// last freed one after truncate or free), so in a fresh cache every
// sequence's blocks are consecutive from a group's start, and each 256-token
// run of it keeps each layer's K and V of a kv head in one stream whatever
// the block size; the hardware prefetchers stop at gaps (decode over
// 16-token blocks, S1's shape on Zen 4: 4.2 ms with every block's regions
// together, 2.1-2.5 grouped; on Zen 5, runs starting a block into a group
// took 5-13% longer at blocks 16 to 128). 32 is the widest
// GEMM panel of any SIMD path; a 16-token block's keys are one narrow panel
// of 16 columns, so it takes half the memory of a 32-token block. One block
// of a Llama-3-8B-shaped cache (32 layers, 8 kv heads, head_dim 128):
//   block_size    f32        bf16 / f16   int8
//   16            4 MiB      2 MiB        1.03 MiB
//   32            8 MiB      4 MiB        2.06 MiB
//   64            16 MiB     8 MiB        4.125 MiB
//   128           32 MiB     16 MiB       8.25 MiB
//   256           64 MiB     32 MiB       16.5 MiB
// (a one-token sequence pins one block). The pool is one 64-byte aligned
// allocation (2 MiB aligned and backed by transparent huge pages where the
// OS offers them, when it is 2 MiB or more), so every region is 64-byte
// aligned, and a group is contiguous: a sequence commits the pages of the
// groups it touches. What a region holds is
// the kernels' business; a freshly reserved block holds unspecified values
// (the pool is not zeroed, blocks are recycled as they are).
//
// Sharing. fork() makes a sequence that shares all of its parent's blocks
// (reference counted): it costs no block and copies no data. A block whose
// reference count is above 1 is never written in place (copy-on-write):
// append() is the only call that makes token slots writable, and when it
// returns, every block receiving the new tokens is owned by that sequence
// alone. If the partially filled last block is shared, append() first copies
// it whole (all layers) into a fresh block. truncate() and free() drop
// references; a block returns to the pool when its count reaches 0.
//
// Writing. Each (sequence, layer) has a written-up-to mark: positions
// [0, mark) hold K/V that attention_layer::forward wrote for that layer. A new
// sequence's marks are 0; append() leaves them (the new positions are
// reserved, not written), truncate() lowers them to the new length, fork()
// copies them. A forward over the cache writes exactly the positions
// [mark, length) of its layer, then raises the mark to the length; any other
// request is refused before anything changes (attention.hpp). So attention
// reads only what the same layer wrote for the same sequence (or for its
// parent, before a fork), never a recycled block's old contents, and it never
// writes a block another sequence holds: the blocks holding [mark, length)
// must be referenced once (append makes them so; a fork between an append and
// the forwards shares them, and both sequences must then truncate to the mark
// and append again). Positions below the mark are read-only. A debug build
// (NDEBUG not defined) fills a block with NaN when it returns to the pool, so
// a read of a freed block shows.
//
// Sliding windows. When every layer of the model slides (Mistral; not Gemma 2
// or Qwen 2 with max_window_layers, which have full layers), the keys a
// sequence's future queries can see are its newest `window` ones:
// drop_outside_window(sequence, window) returns to the pool the leading
// blocks whose every position is outside the window of every query still to
// come (positions below m + 1 - window, m the lowest written-up-to mark over
// the layers: the earliest query a forward will compute), and the sequence
// keeps its length and positions. The dropped positions read as an error, not
// as garbage: a forward whose queries would see one (a layer without a
// window, or a wider one; new queries after truncate() back to within a
// window of them) throws std::invalid_argument naming the sequence, the layer
// and the dropped positions, before anything is written; truncate() below
// dropped(sequence) throws kv_cache_error. A fork shares the blocks left and
// inherits the dropped positions; truncate and free release only the blocks.
//
// Errors. Every misuse (unknown or freed id, append of 0 tokens, a length that
// would overflow std::size_t, truncate beyond the length, out of capacity)
// throws kv_cache_error with a message naming the call, the sequence and the
// numbers, and leaves the cache exactly as before (strong guarantee; an append
// that fails reserves nothing, copies nothing). An invalid configuration throws
// std::invalid_argument naming the field. Running out of host memory (the
// pool, the sequence table) throws std::bad_alloc, also with no effect.
//
// Allocation. Besides the pool, the cache allocates when a sequence is created
// (its entry in the sequence table and its per-layer marks), when one is
// forked (the entry and copies of the block table and the marks), and when a
// sequence's block table outgrows its capacity: tables grow geometrically
// (doubling, at least 8 entries, capped at total_blocks(), the most a sequence
// can hold, while they fit in it) and never shrink, so a sequence allocates
// O(log blocks) times over its life. A sequence that drops positions
// (drop_outside_window) holds at most total_blocks() blocks from its dropped
// positions on, so its length may exceed total_blocks() * block_size; its
// table keeps an entry (4 bytes) per block of positions, the dropped ones
// included. append() within the table capacity already reserved (whether or
// not it takes new blocks from the pool or copies one), truncate(), free(),
// length(), blocks_used() and the counters never allocate.
//
// Threads. What may run concurrently on one cache:
//   - calls naming distinct sequences, from any threads: append, fork,
//     truncate, free, length, blocks_used and attention_layer::forward over
//     the cache (which reads and writes the sequences of its batch), also when
//     those sequences share blocks through fork; create(), config() and the
//     counters (total_blocks ... bytes_in_use) at any time. The sequence
//     table, the reference counts and the free list are guarded by one
//     internal mutex, held only for bookkeeping (block copies, table growth
//     and the kernels' reads and writes happen outside it);
//   - on one sequence, only calls that all merely read it: fork(s), length(s),
//     blocks_used(s). A call that modifies s (append, truncate, free, or a
//     forward whose batch lists s) must not overlap any other call naming s,
//     a forward listing s for another layer included;
//   - never: moving, assigning or destroying the cache alongside any call.
// Calls that do not overlap may come from different threads in any order (the
// mutex orders them). The cache uses no thread pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>

#include "kvhead/config.hpp"
#include "kvhead/export.h"

namespace kvhead {

namespace engine {
struct kv_cache_internals;
}

/// Tokens per block when kv_cache_config::block_size is 0. Every block size
/// (kv_cache_block_sizes, below) is read in place by the kernels, with the
/// same results; 256 decodes fastest on every CPU measured. S1's shape from
/// DRAM, 1 thread, time over block 256's (`decode_block_sizes[_<dtype>]` in
/// kvhead_bench, AMD Zen 5, 2026-12-05), blocks 16 / 32 / 64 / 128: f32
/// 1.28 / 1.25 / 1.18 / 1.06, bf16 1.16 / 1.19 / 1.14 / 1.08, f16 1.17 /
/// 1.01 / 1.02 / 1.05, int8 1.09 / 1.11 / 1.06 / 1.09 (an Intel Xeon: f32
/// within 3%, bf16, f16 and int8 up to 1.10-1.18 at block 16; README). The
/// stream is the same (a sequence's blocks lie side by side, "Block
/// layout"); the compute is not: a 16-key block's q kᵀ has 4 query rows x
/// 16 keys to sum at once (4 FMA chains, half of what hides their latency)
/// and each block is a call of p v, so with the cache in L3 block 16 takes
/// 1.1-1.5x block 256's time. Smaller blocks waste less memory on short or
/// forked sequences.
inline constexpr std::size_t kv_cache_default_block_size = 256;

/// Every block size a kv_cache takes (kv_cache_config::block_size), smallest
/// first.
inline constexpr std::size_t kv_cache_block_sizes[] = {16, 32, 64, 128, 256};

struct kv_cache_config {
  std::size_t num_layers = 1;      // layers of one geometry sharing one sequence-id space
  std::size_t num_kv_heads = 0;    // G
  std::size_t head_dim = 0;        // d (rows are padded to a multiple of 32 floats)
  std::size_t block_size = 0;      // tokens per block: 16, 32, 64, 128 or 256; 0 = default
  std::size_t capacity_bytes = 0;  // pool budget: floor(capacity_bytes / block_bytes) blocks, at least 1
  kv_dtype dtype = kv_dtype::f32;  // how K and V are stored ("Element types")
};

/// block_bytes() of a cache created with `config` (block_size 0: the
/// default; capacity_bytes ignored), from the "Block layout" formula above:
/// what tools and benchmarks size pools with. Throws std::invalid_argument
/// as the constructor does for an invalid geometry.
KVHEAD_API std::size_t kv_cache_block_bytes(const kv_cache_config& config);

using sequence_id = std::uint64_t;

/// Every misuse of a kv_cache (see "Errors" above).
class KVHEAD_API kv_cache_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class KVHEAD_API kv_cache {
 public:
  /// Validates the configuration and allocates the whole pool.
  explicit kv_cache(const kv_cache_config& config);
  ~kv_cache();
  /// Move-only. A moved-from cache may only be destroyed or assigned to.
  kv_cache(kv_cache&&) noexcept;
  kv_cache& operator=(kv_cache&&) noexcept;
  kv_cache(const kv_cache&) = delete;
  kv_cache& operator=(const kv_cache&) = delete;

  /// The configuration, with block_size resolved (never 0).
  const kv_cache_config& config() const;
  /// How K and V are stored (config().dtype).
  kv_dtype dtype() const;

  /// A new empty sequence. Ids start at 1 and are never reused by this cache.
  sequence_id create();
  /// Reserves `tokens` >= 1 new positions at the end of the sequence, for all
  /// layers; the blocks receiving them are exclusively owned on return. The
  /// marks stay: the new positions are unwritten until each layer's forward.
  void append(sequence_id sequence, std::size_t tokens);
  /// A new sequence sharing all of the parent's blocks, with its length, its
  /// per-layer written-up-to marks and its dropped positions.
  sequence_id fork(sequence_id parent);
  /// Shortens the sequence to `length` <= length(sequence) tokens and drops
  /// the blocks it no longer needs; every layer's mark above `length` drops
  /// to it. No data is copied (a later append does the copy-on-write if the
  /// new last block is shared). `length` below dropped(sequence) is refused.
  void truncate(sequence_id sequence, std::size_t length);
  /// Drops the sequence and its block references. The id is not reused.
  void free(sequence_id sequence);
  /// For a model whose every layer slides with windows of at most `window`
  /// >= 1 keys ("Sliding windows" above): frees the sequence's leading blocks
  /// that no future query sees; returns how many it dropped (0 when none
  /// more can go). dropped(sequence) tells where the kept positions start.
  std::size_t drop_outside_window(sequence_id sequence, std::size_t window);
  /// Positions [0, dropped(sequence)) are dropped (a multiple of block_size).
  std::size_t dropped(sequence_id sequence) const;

  std::size_t length(sequence_id sequence) const;
  /// Entries in the sequence's block table: ceil(length / block_size),
  /// dropped ones included (they hold no block).
  std::size_t blocks_used(sequence_id sequence) const;

  std::size_t total_blocks() const;
  std::size_t free_blocks() const;
  std::size_t free_tokens() const;      // free_blocks() * block_size
  std::size_t bytes_per_token() const;  // block_bytes() / block_size
  std::size_t block_bytes() const;
  std::size_t bytes_in_use() const;  // (total_blocks() - free_blocks()) * block_bytes()

 private:
  struct KVHEAD_HIDDEN impl;
  std::unique_ptr<impl> impl_;
  friend struct engine::kv_cache_internals;
};

}  // namespace kvhead
