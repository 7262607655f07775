// Decode attention over the KV cache, K/V already cached, one new query token
// per sequence, attention only (names fixed: outside tools read them; shapes
// in bench/shapes.hpp):
//   S1_decode_gqa/threads:<t>       32/8 heads, past 4096, 5 sequences;
//   S4_decode_mqa/threads:<t>       32/1 heads, past 8192, 16 sequences;
//   S5_decode_ragged16/threads:<t>  16 sequences of pasts 256..4096, one call;
//   S6_decode_swa/threads:<t>       S1 at past 16384 with a sliding window of
//       4096 (the blocks before the window are never read), and
//       S6_decode_swa_full4096/threads:<t>, S1 itself (past 4096, no window),
//       its comparison within the same run (target: within 1.2x);
//   S1_decode_gqa_<dtype>/threads:<t>, S4_decode_mqa_<dtype>/threads:<t>,
//   S5_decode_ragged16_<dtype>/threads:<t>  the same over a cache of dtype
//       bf16, f16 or int8 (the names without a dtype are f32);
//   cache_write/threads:1, cache_write_<dtype>/threads:1  one S1 sequence's
//       K/V (4097 tokens) written into a cache, converted to its dtype, as a
//       prefill writes them (elems_per_s: tokens; gbps: fp32 read + stored
//       bytes written);
//   decode_block_size/block:<b>/threads:1, decode_block_size_<dtype>/...  S1
//       over f32 (bf16, f16, int8) caches of block size b (every block size
//       is read in place);
//   S1_decode_gqa_dtypes/threads:1, S5_decode_ragged16_dtypes/threads:1  the
//       shape over f32, bf16, f16 and int8 caches, and
//   decode_block_sizes/threads:1, decode_block_sizes_<dtype>/threads:1  S1
//       at blocks 16 to 256: variants timed in the same iterations, one call
//       of each in turn, so that the host's drift (these shared machines
//       move by 5-30% within a minute) falls on all of them alike. Counters
//       <variant>_us (median time of a call) and <variant>_ratio: the median
//       over iterations of its time over f32's in the same iteration, or its
//       median over the lowest median of the block sizes;
//   S1_decode_gqa_vs_limit/threads:<t>, S4_decode_mqa_vs_limit/threads:<t>,
//   S5_decode_ragged16_vs_limit/threads:<t>  the shape over each dtype, each
//       call paired in its iteration with a run of its limit doing the call's
//       work (limit_kernels::limit_work): a streaming read of as many bytes
//       from the DRAM limit's buffer in its faster pattern (S1, S5), the peak
//       chains of S4's pct_peak for as many operations. Counters
//       <dtype>_pct_dram or <dtype>_pct_peak: the median over iterations of
//       the call's rate in percent of its limit run's. pct_dram and pct_peak
//       divide a median time by the best rate of the limit's window; where
//       the host's rates move from one minute to the next (Zen 5: S1 1.05-1.6
//       ms), a call and its limit run share their moment.
// Counters: gbps = K/V bytes read per call (stored elements, plus int8's
// scales), gflops = 4 H d (past + 1), and pct_dram, except S4 (each K/V byte
// serves 32 query heads): pct_peak, of the FMA peak, over a bf16 or int8
// cache of the peak of its products' unit (bench/limits.hpp).
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <tbb/task_arena.h>

#include "bench/bench_util.hpp"
#include "bench/cached_decode.hpp"
#include "bench/kvhead_runs.hpp"

namespace {

// Each call of each shape's rotation in a cache of its own (caches[s][call]),
// allocated call by call across the shapes (call 0 of each, then call 1 of
// each, ...), shape `first` first. On these guests the memory an allocation
// gets sets its stream's rate: five caches of the same shape, one cache per
// shape, took from 1.0 to 1.31 times the fastest one's time in the same
// iterations (Zen 5, S1 over f32, 5 repetitions: the slowest median 1.22x).
// A cache per call spreads each shape's calls over the memory of all of
// them (the same five shapes: 1.00-1.07x), and the calls of the shapes timed
// side by side sit in neighbouring allocations.
using call_caches = std::vector<std::vector<std::unique_ptr<kvhead::bench::cached_decode>>>;
call_caches caches_per_call(const std::vector<kvhead::bench::decode_shape>& shapes, std::size_t first) {
  call_caches caches(shapes.size());
  std::size_t most_calls = 0;
  for (const kvhead::bench::decode_shape& shape : shapes) most_calls = std::max(most_calls, shape.calls());
  for (std::size_t call = 0; call < most_calls; ++call)
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const std::size_t s = (first + i) % shapes.size();
      if (call < shapes[s].calls())
        caches[s].push_back(std::make_unique<kvhead::bench::cached_decode>(shapes[s].only_call(call)));
    }
  return caches;
}

}  // namespace

void kvhead::bench::run_cached_decode(benchmark::State& state, const decode_shape& one_rotation, bound_by limit,
                                      int threads) {
  const decode_shape shape = from_dram(one_rotation);
  const auto calls = std::move(caches_per_call({shape}, 0).front());
  const auto q = decode_queries(shape);
  std::vector<float> out(q.size());
  tbb::task_arena arena(threads);
  arena.execute([&] { calls[0]->run(0, q.data(), out.data()); });  // untimed: scratch grows on first use
  std::size_t next = 0;
  for (auto _ : state) {
    arena.execute([&] { calls[next]->run(0, q.data(), out.data()); });
    next = (next + 1) % calls.size();
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, shape.flops_per_call(), shape.bytes_per_call(), limit, threads);
}

namespace {

using kvhead::bench::bound_by;

// The middle value (the upper middle for an even count).
double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + std::ptrdiff_t(values.size() / 2), values.end());
  return values[values.size() / 2];
}

// What run_interleaved divides each variant's time by: the first variant's
// in the same iteration, the fastest variant's median, or the time its limit
// takes for the call's work (its bytes or operations) in the same iteration
// (limit: the counter is then the rate's percent of the limit's).
enum class compare_to { first, fastest, limit };

struct decode_variant {
  std::string name;
  kvhead::bench::decode_shape shape;
  bound_by limit = bound_by::dram_read;  // what compare_to::limit pairs its calls with
};

// Each variant's rotation has at least this many calls (S5's one call of 16
// sequences is repeated), so that it spreads over as many caches.
constexpr std::size_t min_interleaved_calls = 4;

// Variants of one decode (the same calls, other caches), one call of each in
// turn per iteration, on range(0) threads; counters as the header says.
void run_interleaved(benchmark::State& state, const std::vector<decode_variant>& variants, compare_to baseline) {
  std::vector<kvhead::bench::decode_shape> shapes;
  for (const decode_variant& variant : variants) {
    kvhead::bench::decode_shape shape = kvhead::bench::from_dram(variant.shape);
    shape.replicas *= (min_interleaved_calls + shape.calls() - 1) / shape.calls();
    shapes.push_back(shape);
  }
  // Each call of this function (a repetition) allocates the variants' caches
  // (caches_per_call) starting one variant later.
  static std::size_t first_allocated = 0;
  const call_caches decodes = caches_per_call(shapes, first_allocated);
  ++first_allocated;
  const auto q = kvhead::bench::decode_queries(shapes.front());
  std::vector<float> out(q.size());
  // The calls run on the limit runs' arena: a second arena's calls left its
  // one worker there, and 2-thread limit runs of a call's length then ran
  // their slices one after the other (S4 at 2 threads: 117-129% of them).
  kvhead::bench::limit_kernels limit_runs(int(state.range(0)));
  tbb::task_arena& arena = limit_runs.arena();
  for (const auto& calls : decodes)
    for (const auto& decode : calls) arena.execute([&] { decode->run(0, q.data(), out.data()); });  // untimed
  std::vector<std::vector<double>> seconds(variants.size());
  // compare_to::limit: the limit's run before the call in odd iterations,
  // after it in even ones, so that neither always meets the caches the other
  // left; its rate, limit_work's work over its time, from a run whose slices
  // ran at the same time (up to 4 tries; else the iteration has no ratio).
  std::vector<std::vector<double>> limit_rates(variants.size());
  auto work_of = [&](std::size_t v) {
    return variants[v].limit == bound_by::dram_read ? shapes[v].bytes_per_call() : shapes[v].flops_per_call();
  };
  auto time_limit = [&](std::size_t v) {
    double rate = 0.0;
    for (int tries = 0; tries < 4 && rate == 0.0; ++tries) {
      const auto start = std::chrono::steady_clock::now();
      const double work = limit_runs.limit_work(variants[v].limit, work_of(v));
      const double seconds_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (limit_runs.last_run_concurrent()) rate = work / seconds_taken;
    }
    limit_rates[v].push_back(rate);
  };
  if (baseline == compare_to::limit)  // untimed: the DRAM buffer and limit touched, measured, cached
    for (std::size_t v = 0; v < variants.size(); ++v) limit_runs.limit_work(variants[v].limit, work_of(v));
  std::size_t next = 0;
  for (auto _ : state) {
    for (std::size_t v = 0; v < variants.size(); ++v) {
      if (baseline == compare_to::limit && next % 2 == 1) time_limit(v);
      const auto start = std::chrono::steady_clock::now();
      arena.execute([&] { decodes[v][next % decodes[v].size()]->run(0, q.data(), out.data()); });
      seconds[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      benchmark::DoNotOptimize(out.data());
      if (baseline == compare_to::limit && next % 2 == 0) time_limit(v);
    }
    ++next;
  }
  double fastest = median(seconds[0]);
  for (const std::vector<double>& times : seconds) fastest = std::min(fastest, median(times));
  for (std::size_t v = 0; v < variants.size(); ++v) {
    std::vector<double> ratios;  // paired with the first variant's call (or the limit's run) of the same iteration
    for (std::size_t i = 0; i < seconds[v].size(); ++i)
      if (baseline != compare_to::limit)
        ratios.push_back(seconds[v][i] / seconds[0][i]);
      else if (limit_rates[v][i] > 0.0)
        ratios.push_back(100.0 * work_of(v) / seconds[v][i] / limit_rates[v][i]);
    state.counters[variants[v].name + "_us"] = median(seconds[v]) * 1e6;
    if (baseline == compare_to::limit) {
      if (ratios.empty()) {  // no limit run had its threads at once: no figure rather than one core's
        state.SkipWithError("no limit run beside the calls ran on all its threads at once");
        return;
      }
      state.counters[variants[v].name + (variants[v].limit == bound_by::dram_read ? "_pct_dram" : "_pct_peak")] =
          median(ratios);
    } else
      state.counters[variants[v].name + "_ratio"] =
          baseline == compare_to::first ? median(ratios) : median(seconds[v]) / fastest;
  }
}

using kvhead::bench::decode_shape;
using kvhead::bench::run_cached_decode;

decode_shape with_dtype(decode_shape shape, kvhead::kv_dtype dtype) {
  shape.dtype = dtype;
  return shape;
}

// range(0): threads.
void s1_decode_gqa(benchmark::State& state, kvhead::kv_dtype dtype) {
  run_cached_decode(state, with_dtype(kvhead::bench::s1_decode_gqa(), dtype), bound_by::dram_read, int(state.range(0)));
}

// Each K/V byte serves 32 query heads: compute-bound, over a bf16 or int8
// cache by the unit of its products.
bound_by s4_bound(kvhead::kv_dtype dtype) {
  return dtype == kvhead::kv_dtype::bf16   ? bound_by::attention_bf16_peak
         : dtype == kvhead::kv_dtype::int8 ? bound_by::attention_int8_peak
                                           : bound_by::fma_peak;
}

void s4_decode_mqa(benchmark::State& state, kvhead::kv_dtype dtype) {
  run_cached_decode(state, with_dtype(kvhead::bench::s4_decode_mqa(), dtype), s4_bound(dtype), int(state.range(0)));
}

void s5_decode_ragged16(benchmark::State& state, kvhead::kv_dtype dtype) {
  run_cached_decode(state, with_dtype(kvhead::bench::s5_decode_ragged16(), dtype), bound_by::dram_read,
                    int(state.range(0)));
}

void s6_decode_swa(benchmark::State& state, kvhead::kv_dtype dtype) {
  run_cached_decode(state, with_dtype(kvhead::bench::s6_decode_swa(), dtype), bound_by::dram_read, int(state.range(0)));
}

// range(0): threads.
void cache_write(benchmark::State& state, kvhead::kv_dtype dtype) {
  decode_shape shape = with_dtype(kvhead::bench::s1_decode_gqa(), dtype);
  shape.pasts.resize(1);
  shape.per_call = 1;
  kvhead::bench::filled_cache filled(shape);
  const auto kv = kvhead::bench::decode_kv(shape, 0);
  tbb::task_arena arena(int(state.range(0)));
  for (auto _ : state) arena.execute([&] { filled.write(0, *kv); });
  const double tokens = double(shape.pasts[0] + 1), values = 2.0 * double(kv->k.size());
  kvhead::bench::set_element_rates(state, tokens, values * sizeof(float) + shape.bytes_per_call());
}

// range(0): block size, range(1): threads.
// S1 over a cache of `dtype` in blocks of `block` tokens.
decode_shape s1_in_blocks(kvhead::kv_dtype dtype, std::size_t block) {
  decode_shape shape = with_dtype(kvhead::bench::s1_decode_gqa(), dtype);
  shape.block_size = block;
  return shape;
}

void decode_block_size(benchmark::State& state, kvhead::kv_dtype dtype) {
  run_cached_decode(state, s1_in_blocks(dtype, std::size_t(state.range(0))), bound_by::dram_read, int(state.range(1)));
}

// limit: the bound of the shape over each dtype (compare_to::limit).
void decode_dtypes(benchmark::State& state, decode_shape shape, compare_to baseline,
                   bound_by (*limit)(kvhead::kv_dtype)) {
  std::vector<decode_variant> variants;
  for (const kvhead::kv_dtype dtype :
       {kvhead::kv_dtype::f32, kvhead::kv_dtype::bf16, kvhead::kv_dtype::f16, kvhead::kv_dtype::int8})
    variants.push_back({kvhead::to_string(dtype), with_dtype(shape, dtype), limit(dtype)});
  run_interleaved(state, variants, baseline);
}

bound_by dram_bound(kvhead::kv_dtype) { return bound_by::dram_read; }

void decode_block_sizes(benchmark::State& state, kvhead::kv_dtype dtype) {
  std::vector<decode_variant> variants;
  for (const std::size_t block : kvhead::kv_cache_block_sizes)
    variants.push_back({"block" + std::to_string(block), s1_in_blocks(dtype, block)});
  run_interleaved(state, variants, compare_to::fastest);
}

// "<name>" for f32, "<name>_<dtype>" for the others.
std::string dtype_name(const char* name, kvhead::kv_dtype dtype) {
  return dtype == kvhead::kv_dtype::f32 ? std::string(name) : std::string(name) + "_" + kvhead::to_string(dtype);
}

constexpr kvhead::kv_dtype dtypes[] = {kvhead::kv_dtype::f32, kvhead::kv_dtype::bf16, kvhead::kv_dtype::f16,
                                       kvhead::kv_dtype::int8};

const bool registered = [] {
  for (const kvhead::kv_dtype dtype : dtypes) {
    auto* bench =
        benchmark::RegisterBenchmark(dtype_name("decode_block_size", dtype).c_str(), decode_block_size, dtype);
    bench->ArgNames({"block", "threads"})->UseRealTime();
    for (const std::size_t block : kvhead::kv_cache_block_sizes) bench->Args({std::int64_t(block), 1});
  }
  for (const kvhead::kv_dtype dtype : dtypes)
    benchmark::RegisterBenchmark(dtype_name("decode_block_sizes", dtype).c_str(), decode_block_sizes, dtype)
        ->ArgNames({"threads"})
        ->Arg(1)
        ->UseRealTime();
  for (const auto& [name, shape] : {std::pair{"S1_decode_gqa", kvhead::bench::s1_decode_gqa()},
                                    std::pair{"S5_decode_ragged16", kvhead::bench::s5_decode_ragged16()}})
    benchmark::RegisterBenchmark((std::string(name) + "_dtypes").c_str(), decode_dtypes, shape, compare_to::first,
                                 &dram_bound)
        ->ArgNames({"threads"})
        ->Arg(1)
        ->UseRealTime();
  using limit_function = bound_by (*)(kvhead::kv_dtype);
  for (const auto& [name, shape, limit] :
       {std::tuple{"S1_decode_gqa_vs_limit", kvhead::bench::s1_decode_gqa(), limit_function{&dram_bound}},
        std::tuple{"S4_decode_mqa_vs_limit", kvhead::bench::s4_decode_mqa(), limit_function{&s4_bound}},
        std::tuple{"S5_decode_ragged16_vs_limit", kvhead::bench::s5_decode_ragged16(), limit_function{&dram_bound}}})
    benchmark::RegisterBenchmark(name, decode_dtypes, shape, compare_to::limit, limit)
        ->ArgNames({"threads"})
        ->Arg(1)
        ->Arg(2)
        ->UseRealTime();
  for (const kvhead::kv_dtype dtype : dtypes)
    benchmark::RegisterBenchmark(dtype_name("cache_write", dtype).c_str(), cache_write, dtype)
        ->ArgNames({"threads"})
        ->Arg(1)
        ->UseRealTime();
  using decode_function = void (*)(benchmark::State&, kvhead::kv_dtype);
  const std::pair<const char*, decode_function> shapes[] = {{"S1_decode_gqa", &s1_decode_gqa},
                                                            {"S4_decode_mqa", &s4_decode_mqa},
                                                            {"S5_decode_ragged16", &s5_decode_ragged16}};
  for (const auto& [name, function] : shapes)
    for (const kvhead::kv_dtype dtype : dtypes)
      benchmark::RegisterBenchmark(dtype_name(name, dtype).c_str(), function, dtype)
          ->ArgNames({"threads"})
          ->Arg(1)
          ->Arg(2)
          ->UseRealTime();
  for (const auto& [name, function] : {std::pair<const char*, decode_function>{"S6_decode_swa", &s6_decode_swa},
                                       {"S6_decode_swa_full4096", &s1_decode_gqa}})
    benchmark::RegisterBenchmark(name, function, kvhead::kv_dtype::f32)
        ->ArgNames({"threads"})
        ->Arg(1)
        ->Arg(2)
        ->UseRealTime();
  return true;
}();

}  // namespace
