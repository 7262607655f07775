// Textbook baselines (bench/textbook.hpp) on the kvhead benchmarks' shapes,
// inputs and counters (bench/shapes.hpp), so the ratios are direct:
//   textbook_S1_decode_gqa/threads:<t>, textbook_S4_decode_mqa/threads:<t>,
//   textbook_S5_decode_ragged16/threads:<t>  one decode step per call over
//       plain per-sequence caches, rotating as the kvhead ones; pct_dram (S4:
//       pct_peak, as kvhead's);
//   textbook_S2_prefill_gqa_causal/threads:<t>  causal attention; pct_peak;
//   textbook_S3_mha_layer/threads:<t>  the whole layer; pct_peak.
// t is OpenBLAS's thread count. At set-up each textbook's output is checked
// against kvhead's on the same inputs (max |diff| <= 64 eps sqrt(depth)
// max|kvhead|, depth the summed lengths of the chained reductions); a
// disagreement ends the benchmark with an error instead of timing something
// else.
#include <cblas.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

#include "bench/bench_util.hpp"
#include "bench/cached_decode.hpp"
#include "bench/kvhead_runs.hpp"
#include "bench/textbook.hpp"

namespace {

using namespace kvhead::bench;

// False (and the benchmark skipped with the numbers) unless textbook agrees
// with kvhead; NaN never agrees.
bool agrees(benchmark::State& state, const std::vector<float>& textbook, const std::vector<float>& kvhead,
            std::size_t depth) {
  double largest = 0.0, difference = 0.0;
  for (std::size_t i = 0; i < kvhead.size(); ++i) {
    largest = std::max(largest, double(std::fabs(kvhead[i])));
    difference = std::max(difference, double(std::fabs(textbook[i] - kvhead[i])));
    if (std::isnan(textbook[i]) || std::isnan(kvhead[i])) difference = NAN;
  }
  const double tolerance = 64.0 * FLT_EPSILON * std::sqrt(double(depth)) * largest;
  if (difference <= tolerance) return true;
  state.SkipWithError(("textbook and kvhead outputs differ: max |diff| " + std::to_string(difference) +
                       " > tolerance " + std::to_string(tolerance))
                          .c_str());
  return false;
}

void run_textbook_decode(benchmark::State& state, const decode_shape& one_rotation, bound_by limit) {
  const decode_shape shape = from_dram(one_rotation);
  const int threads = int(state.range(0));
  openblas_set_num_threads(threads);
  textbook_decode textbook(shape);
  const auto q = decode_queries(shape);
  std::vector<float> out(q.size()), expected(q.size());
  cached_decode(shape.only_call(0)).run(0, q.data(), expected.data());
  textbook.run(0, q.data(), out.data());
  if (!agrees(state, out, expected, shape.head_dim + *std::max_element(shape.pasts.begin(), shape.pasts.end()) + 1)) {
    return;
  }
  std::size_t next = 0;
  for (auto _ : state) {
    textbook.run(next, q.data(), out.data());
    next = (next + 1) % shape.calls();
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, shape.flops_per_call(), shape.bytes_per_call(), limit, threads);
}

void textbook_s1(benchmark::State& state) { run_textbook_decode(state, s1_decode_gqa(), bound_by::dram_read); }
void textbook_s4(benchmark::State& state) { run_textbook_decode(state, s4_decode_mqa(), bound_by::fma_peak); }
void textbook_s5(benchmark::State& state) { run_textbook_decode(state, s5_decode_ragged16(), bound_by::dram_read); }

void textbook_s2(benchmark::State& state) {
  const int threads = int(state.range(0));
  openblas_set_num_threads(threads);
  const prefill_shape shape = s2_prefill_gqa_causal();
  const prefill_inputs in(shape);
  textbook_prefill textbook(shape);
  std::vector<float> out(in.q.size()), expected(in.q.size());
  kvhead_prefill(shape, in, expected.data());
  textbook.run(in, out.data());
  if (!agrees(state, out, expected, shape.head_dim + shape.tokens)) return;
  for (auto _ : state) {
    textbook.run(in, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, shape.flops(), shape.bytes(), bound_by::fma_peak, threads);
}

void textbook_s3(benchmark::State& state) {
  const int threads = int(state.range(0));
  openblas_set_num_threads(threads);
  const layer_shape shape = s3_mha_layer();
  const layer_inputs in(shape);
  textbook_layer textbook(shape, in);
  std::vector<float> y(in.x.size()), expected(in.x.size());
  kvhead_layer(shape, in).forward(in.x.data(), shape.batch, shape.seq, expected.data());
  textbook.run(in.x.data(), y.data());
  if (!agrees(state, y, expected, 3 * shape.d_model + shape.head_dim + shape.seq)) return;
  for (auto _ : state) {
    textbook.run(in.x.data(), y.data());
    benchmark::DoNotOptimize(y.data());
  }
  set_rates(state, shape.flops(), shape.bytes(), bound_by::fma_peak, threads);
}

}  // namespace

BENCHMARK(textbook_s1)->Name("textbook_S1_decode_gqa")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(textbook_s2)->Name("textbook_S2_prefill_gqa_causal")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(textbook_s3)->Name("textbook_S3_mha_layer")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(textbook_s4)->Name("textbook_S4_decode_mqa")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(textbook_s5)->Name("textbook_S5_decode_ragged16")->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();
