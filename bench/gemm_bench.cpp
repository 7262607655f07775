// GEMM: kvhead (packing included, as OpenBLAS), kvhead with B pre-packed (as
// for weights), OpenBLAS cblas_sgemm at the same thread count, and the bf16
// GEMM with B pre-packed in bf16 (weights; A rounded as it is packed) on the
// bf16 unit in use.
// Names: gemm/M:<m>/N:<n>/K:<k>/threads:<t>, gemm_prepacked/..., gemm_openblas/...,
// gemm_bf16/...
// Counters: gflops, gbps (A, B and C once; B at 2 bytes for gemm_bf16),
// pct_peak (of the FMA peak; of the bf16 unit's peak for gemm_bf16).
#include <cblas.h>

#include <tbb/task_arena.h>

#include "bench/bench_util.hpp"
#include "engine/gemm/gemm.hpp"
#include "engine/gemm/gemm_bf16.hpp"

namespace {

using namespace kvhead::engine;

struct gemm_inputs {
  std::size_t m, n, k;
  std::vector<float> a, b, c;
  explicit gemm_inputs(const benchmark::State& state)
      : m(std::size_t(state.range(0))),
        n(std::size_t(state.range(1))),
        k(std::size_t(state.range(2))),
        a(kvhead::bench::random_floats(m * k, 1)),
        b(kvhead::bench::random_floats(k * n, 2)),
        c(m * n) {}
  void report(benchmark::State& state) const {
    kvhead::bench::set_rates(state, 2.0 * double(m) * double(n) * double(k), 4.0 * double(m * k + k * n + m * n),
                             kvhead::bench::bound_by::fma_peak, int(state.range(3)));
  }
};

void gemm_kvhead(benchmark::State& state) {
  gemm_inputs in(state);
  tbb::task_arena arena(int(state.range(3)));
  for (auto _ : state) {
    arena.execute([&] {
      gemm({in.m, in.n, in.k}, 1.0f, {in.a.data(), in.k, transpose::no}, {in.b.data(), in.n, transpose::no}, 0.0f,
           in.c.data(), in.n);
    });
    benchmark::DoNotOptimize(in.c.data());
  }
  in.report(state);
}

void gemm_prepacked(benchmark::State& state) {
  gemm_inputs in(state);
  const packed_b packed(in.k, in.n, {in.b.data(), in.n, transpose::no});
  tbb::task_arena arena(int(state.range(3)));
  for (auto _ : state) {
    arena.execute([&] {
      gemm({in.m, in.n, in.k}, 1.0f, {in.a.data(), in.k, transpose::no}, packed.view(), 0.0f, in.c.data(), in.n);
    });
    benchmark::DoNotOptimize(in.c.data());
  }
  in.report(state);
}

void gemm_openblas(benchmark::State& state) {
  gemm_inputs in(state);
  openblas_set_num_threads(int(state.range(3)));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(in.m), int(in.n), int(in.k), 1.0f, in.a.data(),
                int(in.k), in.b.data(), int(in.n), 0.0f, in.c.data(), int(in.n));
    benchmark::DoNotOptimize(in.c.data());
  }
  in.report(state);
}

void gemm_bf16_prepacked(benchmark::State& state) {
  gemm_inputs in(state);
  const packed_bf16_b packed(in.k, in.n, gemm_operand{in.b.data(), in.n, transpose::no});
  tbb::task_arena arena(int(state.range(3)));
  for (auto _ : state) {
    arena.execute(
        [&] { gemm_bf16({in.m, in.n, in.k}, {in.a.data(), in.k, transpose::no}, packed, 0.0f, in.c.data(), in.n); });
    benchmark::DoNotOptimize(in.c.data());
  }
  kvhead::bench::set_rates(state, 2.0 * double(in.m) * double(in.n) * double(in.k),
                           4.0 * double(in.m * in.k + in.m * in.n) + 2.0 * double(in.k * in.n),
                           kvhead::bench::bound_by::bf16_peak, int(state.range(3)));
  state.SetLabel(to_string(active_bf16_unit()));
}

// Square sizes and the attention shapes of the foundation issue, at 1 and 2 threads.
void gemm_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"M", "N", "K", "threads"});
  for (int threads : {1, 2}) {
    for (int size : {256, 512, 1024, 2048}) bench->Args({size, size, size, threads});
    bench->Args({1024, 1024, 128, threads});
    bench->Args({1024, 128, 1024, threads});
    bench->Args({1, 4096, 128, threads});
    bench->Args({32, 4096, 128, threads});
  }
  bench->UseRealTime();
}

}  // namespace

BENCHMARK(gemm_kvhead)->Name("gemm")->Apply(gemm_shapes);
BENCHMARK(gemm_prepacked)->Name("gemm_prepacked")->Apply(gemm_shapes);
BENCHMARK(gemm_openblas)->Name("gemm_openblas")->Apply(gemm_shapes);
BENCHMARK(gemm_bf16_prepacked)->Name("gemm_bf16")->Apply(gemm_shapes);
