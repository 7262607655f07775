// `kvhead demo` and `kvhead kernels` end to end (the built binary as a child
// process), on small shapes so the sanitizer build stays fast: the summary,
// the cached-versus-recomputed check, the --csv rows, the plain progress
// lines (stdout is not a terminal here), and the usage errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kvhead/config.hpp"
#include "tests/cli_test_util.hpp"

namespace kvhead::cli_test {
namespace {

constexpr int exit_failure = 1, exit_usage = 2;

const std::vector<std::string> small_model = {"--layers",   "2",  "--d-model",  "64", "--heads",  "4",
                                              "--kv-heads", "2",  "--head-dim", "16", "--prompt", "40",
                                              "--tokens",   "40", "--batch",    "2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) result.push_back(line);
  return result;
}

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Fails with `exit_code` and one stderr line starting "kvhead demo: ".
void expect_demo_failure(const std::vector<std::string>& args, int exit_code, const std::string& mention) {
  const cli_result result = run_kvhead(with({"demo"}, args));
  INFO("stderr: " << result.err);
  CHECK(result.signal == 0);
  CHECK(result.exit_code == exit_code);
  CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
  CHECK(result.err.starts_with("kvhead demo: "));
  CHECK_MESSAGE(mentions(result.err, mention), "mentions " << mention);
}

TEST_CASE("demo_small_model") {
  scratch_dir dir;
  const std::string csv = dir.file("latency.csv");
  const cli_result result = run_kvhead(with(with({"demo"}, small_model), {"--csv", csv, "--threads", "2"}));
  INFO("stdout: " << result.out);
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.signal == 0);
  CHECK(result.err.empty());

  // The model stated, the summary lines, the check.
  for (const char* text :
       {"2 attention layers", "d_model 64", "4 query heads", "2 kv heads", "head_dim 16", "RoPE theta 10000", "causal",
        "rmsnorm", "prefill", "decode", "tokens/s", "latency", "KV cache", "no cache", "speed-up", "identical"})
    CHECK_MESSAGE(mentions(result.out, text), "output mentions " << text);
  CHECK(!mentions(result.out, "DIFFERENT"));
  CHECK(mentions(result.out, "cached and recomputed outputs: identical"));

  // Not a terminal: plain progress lines every 32 tokens and at the end, no '\r'.
  CHECK(result.out.find('\r') == std::string::npos);
  CHECK(mentions(result.out, "decode 32/40 tokens x 2 seq"));
  CHECK(mentions(result.out, "decode 40/40 tokens x 2 seq"));
  CHECK(!mentions(result.out, "decode 31/40"));

  // The CSV: header, then 40 rows per sequence, positions 40..79 in order.
  const std::vector<std::string> rows = lines(read_bytes(csv));
  REQUIRE(rows.size() == 81);
  CHECK(rows[0] == "seq,position,latency_ms");
  std::map<std::size_t, std::vector<std::size_t>> positions;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    CAPTURE(rows[i]);
    const std::string& line = rows[i];
    const std::size_t comma1 = line.find(','), comma2 = line.find(',', comma1 + 1);
    REQUIRE(comma1 != std::string::npos);
    REQUIRE(comma2 != std::string::npos);
    std::size_t seq = 0, position = 0;
    double latency = -1.0;
    CHECK(std::from_chars(line.data(), line.data() + comma1, seq).ptr == line.data() + comma1);
    CHECK(std::from_chars(line.data() + comma1 + 1, line.data() + comma2, position).ptr == line.data() + comma2);
    CHECK(std::from_chars(line.data() + comma2 + 1, line.data() + line.size(), latency).ptr ==
          line.data() + line.size());
    CHECK(latency >= 0.0);
    positions[seq].push_back(position);
  }
  REQUIRE(positions.size() == 2);
  for (const auto& entry : positions) {
    const std::vector<std::size_t>& list = entry.second;
    CAPTURE(entry.first);
    REQUIRE(list.size() == 40);
    for (std::size_t i = 0; i < list.size(); ++i) CHECK(list[i] == 40 + i);
  }
  CHECK(entries(dir.path()) == std::vector<std::string>{"latency.csv"});
}

TEST_CASE("demo_same_check_with_one_thread_mha_and_few_tokens") {
  // MHA (G = H), d_model != H * d, fewer decoded tokens than the 16-step
  // window, one thread, another seed.
  const cli_result result =
      run_kvhead({"demo", "--layers", "3", "--d-model", "40", "--heads", "2", "--kv-heads", "2", "--head-dim", "8",
                  "--prompt", "5", "--tokens", "9", "--threads", "1", "--seed", "0"});
  INFO("stdout: " << result.out);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 0);
  CHECK(mentions(result.out, "cached and recomputed outputs: identical"));
  CHECK(mentions(result.out, "decode 9/9 tokens x 1 seq"));
}

TEST_CASE("demo_under_the_fastest_reduction_order_reports_differences_by_design") {
  // A long prompt on 2 threads: the cached and the recomputed passes split
  // their sums differently, which KVHEAD_REDUCTION=fastest allows. The demo
  // called that an engine bug and exited 1.
  const cli_result result = run_kvhead({"demo", "--layers", "1", "--d-model", "64", "--heads", "1", "--kv-heads", "1",
                                        "--head-dim", "64", "--prompt", "4000", "--tokens", "16", "--threads", "2"},
                                       {"KVHEAD_REDUCTION=fastest"});
  INFO("stdout: " << result.out);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 0);
  CHECK(mentions(result.out, "(KVHEAD_REDUCTION=fastest: not bit-identical by design)"));
}

TEST_CASE("demo_check_across_a_cache_block_boundary") {
  // 250 + 20 tokens: the decode and the recomputed stretch (positions
  // 254-269) cross the first 256-token block; 3 sequences, 1 kv head (MQA).
  const cli_result result = run_kvhead({"demo", "--layers", "1", "--d-model", "32", "--heads", "2", "--kv-heads", "1",
                                        "--head-dim", "16", "--prompt", "250", "--tokens", "20", "--batch", "3"});
  INFO("stdout: " << result.out);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 0);
  CHECK(mentions(result.out, "cached and recomputed outputs: identical"));
  CHECK(mentions(result.out, "positions 254-269"));
  CHECK(mentions(result.out, "6 of 6 block(s) in use"));
}

TEST_CASE("demo_block_size_sets_the_cache_blocks_and_keeps_the_check") {
  // 40 + 30 tokens in 16-token blocks: 5 blocks per sequence, 2 sequences;
  // the recomputed stretch (positions 54-69) crosses blocks. An int8 cache
  // at block 32 as well: its decode is the same at every block size.
  const std::vector<std::string> model = {"--layers",   "2",  "--d-model", "64", "--heads",  "4",  "--kv-heads", "2",
                                          "--head-dim", "16", "--prompt",  "40", "--tokens", "30", "--batch",    "2"};
  const cli_result result = run_kvhead(with(with({"demo"}, model), {"--block-size", "16"}));
  INFO("stdout: " << result.out);
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 0);
  CHECK(mentions(result.out, "10 block(s) of 16 tokens x 2 layers"));
  CHECK(mentions(result.out, "10 of 10 block(s) in use (16 tokens x 2 layers each)"));
  CHECK(mentions(result.out, "cached and recomputed outputs: identical"));
  const cli_result int8_default = run_kvhead(with(with({"demo"}, model), {"--kv-dtype", "int8"}));
  const cli_result int8_32 = run_kvhead(with(with({"demo"}, model), {"--kv-dtype", "int8", "--block-size", "32"}));
  CHECK(int8_default.exit_code == 0);
  CHECK(int8_32.exit_code == 0);
  CHECK(mentions(int8_32.out, "block(s) of 32 tokens"));
  // The same decoded outputs: the same largest difference from the recomputed (f32 layers, no cache) ones.
  auto largest_difference = [](const std::string& out) {
    const std::size_t at = out.find("max |diff| ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find(' ', at + 11) - at);
  };
  CHECK(!largest_difference(int8_default.out).empty());
  CHECK(largest_difference(int8_default.out) == largest_difference(int8_32.out));
}

TEST_CASE("demo_kv_dtype_prints_bytes_per_token_and_all_prints_the_table") {
  // 300 + 40 tokens (a second 256-token block), GQA 4:2, head_dim 16, 2 layers.
  const std::vector<std::string> model = {"--layers",   "2",  "--d-model", "64",  "--heads",  "4",  "--kv-heads", "2",
                                          "--head-dim", "16", "--prompt",  "300", "--tokens", "40", "--threads",  "1"};
  const cli_result bf16 = run_kvhead(with(with({"demo"}, model), {"--kv-dtype", "bf16"}));
  INFO("stdout: " << bf16.out);
  INFO("stderr: " << bf16.err);
  CHECK(bf16.exit_code == 0);
  // 2 layers x 2 kv heads x (K + V) x 32 padded dims x 2 bytes.
  CHECK(mentions(bf16.out, "KV cache: bf16, 512 bytes per token"));
  CHECK(mentions(bf16.out, "cached (bf16 K/V) and recomputed (f32 layers, no cache) outputs"));
  // bf16 layers round K/V to bf16 themselves: a bf16 cache then decodes bit for
  // bit (README), and the demo checks it as it checks f32.
  const cli_result bf16_layers = run_kvhead(with(with({"demo"}, model), {"--kv-dtype", "bf16", "--precision", "bf16"}));
  CHECK(bf16_layers.exit_code == 0);
  CHECK(mentions(bf16_layers.out, "cached and recomputed outputs: identical, bit for bit"));
  CHECK(mentions(bf16.out, "tokens/s"));

  const cli_result all = run_kvhead(with(with({"demo"}, model), {"--kv-dtype", "all"}));
  INFO("stdout: " << all.out);
  CHECK(all.exit_code == 0);
  CHECK(mentions(all.out, "cached and recomputed outputs: identical"));  // the f32 run keeps its check
  const std::vector<std::string> text = lines(all.out);
  const auto header = std::find_if(text.begin(), text.end(), [](const std::string& line) {
    return mentions(line, "dtype") && mentions(line, "tokens/s") && mentions(line, "cache MiB");
  });
  REQUIRE(header != text.end());
  REQUIRE(text.end() - header >= 5);
  // precision, dtype, tokens/s, bytes/token, cache MiB, max |diff| relative; f32 first (difference 0).
  const char* names[] = {"f32", "bf16", "f16", "int8"};
  const double ceilings[] = {0.0, 1e-2, 2e-3, 3e-2};
  const std::size_t bytes[] = {1024, 512, 512, 256 + 32};
  for (std::size_t i = 0; i < 4; ++i) {
    std::istringstream row(header[std::ptrdiff_t(i + 1)]);
    std::string compute, name;
    double tokens_per_second = 0.0, mib = 0.0, difference = -1.0;
    std::size_t bytes_per_token = 0;
    row >> compute >> name >> tokens_per_second >> bytes_per_token >> mib >> difference;
    CAPTURE(name);
    CHECK(compute == "f32");
    CHECK(name == names[i]);
    CHECK(tokens_per_second > 0.0);
    CHECK(bytes_per_token == bytes[i]);
    CHECK(difference >= 0.0);
    CHECK(difference <= ceilings[i]);
  }
}

TEST_CASE("demo_precision_all_prints_both_runs_each_with_its_bit_for_bit_check") {
  // bf16 layers over an f32 cache: the cache stores the rounded K/V the
  // cache-free forward computes, so the recomputed outputs stay identical.
  const std::vector<std::string> model = {"--layers",   "2",  "--d-model", "64", "--heads",  "4",  "--kv-heads", "2",
                                          "--head-dim", "16", "--prompt",  "40", "--tokens", "20", "--threads",  "1"};
  const cli_result all = run_kvhead(with(with({"demo"}, model), {"--precision", "all"}));
  INFO("stdout: " << all.out);
  INFO("stderr: " << all.err);
  CHECK(all.exit_code == 0);
  CHECK(mentions(all.out, "precision bf16 (weights 48.0 KiB in all)"));  // 2 layers x 2 (4 + 2) 16 x 64 x 2 bytes
  const std::vector<std::string> text = lines(all.out);
  CHECK(std::count_if(text.begin(), text.end(), [](const std::string& line) {
          return mentions(line, "cached and recomputed outputs: identical");
        }) == 2);
  const auto header = std::find_if(text.begin(), text.end(), [](const std::string& line) {
    return mentions(line, "precision") && mentions(line, "tokens/s") && mentions(line, "weight MiB");
  });
  REQUIRE(header != text.end());
  REQUIRE(text.end() - header >= 3);
  const char* names[] = {"f32", "bf16"};
  for (std::size_t i = 0; i < 2; ++i) {
    std::istringstream row(header[std::ptrdiff_t(i + 1)]);
    std::string compute, dtype;
    double tokens_per_second = 0.0, mib = 0.0, difference = -1.0;
    std::size_t bytes_per_token = 0;
    row >> compute >> dtype >> tokens_per_second >> bytes_per_token >> mib >> difference;
    CAPTURE(compute);
    CHECK(compute == names[i]);
    CHECK(dtype == "f32");
    CHECK(tokens_per_second > 0.0);
    CHECK(difference >= 0.0);
    CHECK(difference <= (i == 0 ? 0.0 : 2e-2));  // the bf16 layer's ceiling (attention.hpp)
    if (i == 1) CHECK(difference > 0.0);         // bf16 really rounds
  }
}

TEST_CASE("kernels_runs") {
  const cli_result result = run_kvhead({"kernels", "--threads", "2"});
  INFO("stderr: " << result.err);
  CHECK(result.exit_code == 0);
  CHECK(result.err.empty());
  CHECK(mentions(result.out, "SIMD path"));
  CHECK(mentions(result.out, "CPU: "));
  CHECK(mentions(result.out, std::string("configuration ") + kvhead::kernel_config_name() + ": "));
  CHECK(mentions(result.out, "KVHEAD_CONFIG"));
  CHECK(mentions(result.out, "KC 256"));
  CHECK(mentions(result.out, "1024 x 1024 x 1024"));
  CHECK(mentions(result.out, "GFLOP/s"));
}

TEST_CASE("demo_usage_errors") {
  struct bad {
    std::vector<std::string> args;
    std::string mention;
  };
  const std::vector<bad> cases = {
      {{"--layers", "0"}, "--layers"},
      {{"--d-model", "abc"}, "--d-model"},
      {{"--heads", "-4"}, "--heads"},
      {{"--kv-heads", "3", "--heads", "4"}, "--kv-heads 3 must divide --heads 4"},
      {{"--heads", "6"}, "--kv-heads 8 (the default) must divide --heads 6"},
      {{"--head-dim", "7"}, "--head-dim must be even"},
      {{"--prompt", "0"}, "--prompt"},
      {{"--tokens", "1.5"}, "--tokens"},
      {{"--batch", ""}, "--batch"},
      {{"--threads", "1025"}, "--threads"},
      {{"--seed", "x"}, "--seed"},
      {{"--seed", "-1"}, "--seed"},
      {{"--csv"}, "--csv needs a value"},
      {{"--csv="}, "--csv"},
      {{"--weights", "w"}, "--weights"},
      {{"--kv-dtype", "fp8"}, "--kv-dtype needs f32, bf16, f16, int8 or all, got 'fp8'"},
      {{"--kv-dtype", "ALL"}, "--kv-dtype"},
      {{"--kv-dtype"}, "--kv-dtype needs a value"},
      {{"--precision", "fp16"}, "--precision needs f32, bf16 or all, got 'fp16'"},
      {{"--block-size", "100"}, "--block-size needs 16, 32, 64, 128 or 256, got '100'"},
      {{"--block-size", "0"}, "--block-size needs 16, 32, 64, 128 or 256, got '0'"},
      {{"--block-size"}, "--block-size needs a value"},
      {{"--precision", "BF16"}, "--precision"},
      {{"extra"}, "'extra'"},
  };
  for (const bad& c : cases) {
    CAPTURE(c.mention);
    expect_demo_failure(c.args, exit_usage, c.mention);
  }
}

TEST_CASE("demo_file_errors") {
  scratch_dir dir;
  SUBCASE("csv folder missing") {
    const std::string csv = dir.file("no-such-dir/l.csv");
    expect_demo_failure(with(small_model, {"--csv", csv}), exit_failure, "does not exist");
  }
  SUBCASE("csv name longer than its folder allows: refused before the run, not after it") {
    const std::string csv = dir.file(std::string(300, 'n') + ".csv");
    const cli_result result = run_kvhead(with({"demo"}, with(small_model, {"--csv", csv})));
    CHECK(result.exit_code == exit_failure);
    CHECK(mentions(result.err, "its name is longer than the 255 bytes"));
    CHECK(result.out.empty());
  }
  SUBCASE("bad KVHEAD_ISA") {
    const cli_result result = run_kvhead(with({"demo"}, small_model), {"KVHEAD_ISA=neon"});
    CHECK(result.exit_code == exit_failure);
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK(mentions(result.err, "KVHEAD_ISA=neon"));
    CHECK(result.out.empty());
  }
  SUBCASE("more memory than the machine has: refused at once, naming the parts") {
    // 1024 layers of d_model 65536: 1024 x 2 x (32 + 8) x 64 x 65536 x 4 bytes = 1.25 TiB of weights.
    const cli_result result = run_kvhead({"demo", "--layers", "1024", "--d-model", "65536"});
    CHECK(result.exit_code == exit_failure);
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK(mentions(result.err, "of memory (weights 1280.00 GiB"));
    CHECK(mentions(result.err, "this process may use"));
    CHECK(result.out.empty());  // nothing generated, nothing printed
  }
  SUBCASE("bad KVHEAD_REDUCTION: refused before any work") {
    const cli_result result = run_kvhead(with({"demo"}, small_model), {"KVHEAD_REDUCTION=sideways"});
    CHECK(result.exit_code == exit_failure);
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK(mentions(result.err, "KVHEAD_REDUCTION=sideways"));
    CHECK(result.out.empty());  // nothing generated, nothing printed
  }
}

TEST_CASE("demo_and_kernels_help") {
  const cli_result demo = run_kvhead({"demo", "--help"});
  CHECK(demo.exit_code == 0);
  for (const char* text : {"--layers", "--d-model", "--heads", "--kv-heads", "--head-dim", "--prompt", "--tokens",
                           "--batch", "--threads", "--seed", "--csv", "rmsnorm"})
    CHECK_MESSAGE(mentions(demo.out, text), "demo help mentions " << text);
  const cli_result top = run_kvhead({"--help"});
  CHECK(top.exit_code == 0);
  for (const char* text : {"demo", "decode", "kernels", "GFLOP/s", "--csv"})
    CHECK_MESSAGE(mentions(top.out, text), "kvhead --help mentions " << text);
  const cli_result kernels = run_kvhead({"kernels", "--help"});
  CHECK(kernels.exit_code == 0);
  CHECK(mentions(kernels.out, "--threads"));
  const cli_result bad = run_kvhead({"kernels", "--threads", "0"});
  CHECK(bad.exit_code == exit_usage);
  CHECK(bad.err.starts_with("kvhead kernels: "));
}

}  // namespace
}  // namespace kvhead::cli_test
