// `kvhead run` and `kvhead decode` with --precision bf16 (attention.hpp,
// attention_config::precision) on every PyTorch golden case and model
// folder: within the bf16 ceiling of the f32 output (max |diff| / max |f32|
// <= 2e-2, the figure printed), not equal to it (bf16 really rounds), and
// the same bits for any thread count, and decoded in chunks over a KV cache
// (f32 or bf16: both store the rounded K/V exactly) as the cache-free run,
// under each choice of kernels for attention's bf16 products that runs here.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/io/npy.hpp"
#include "kvhead/config.hpp"
#include "tests/cli_test_util.hpp"

namespace kvhead::cli_test {
namespace {

std::vector<std::string> join(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void expect_clean_success(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  const cli_result result = run_kvhead(args, env);
  INFO("args: " << [&] {
    std::string text;
    for (const std::string& arg : args) text += arg + " ";
    return text;
  }());
  INFO("stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.err.empty());
}

/// The flags that load a case: a golden weights folder or a model folder.
struct layer_case {
  std::string name;
  std::vector<std::string> flags;
};

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (char ch : text + " ") {
    if (ch == ' ' || ch == '\n' || ch == '\t') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += ch;
    }
  }
  return words;
}

std::vector<layer_case> every_case() {
  std::vector<layer_case> cases;
  for (const std::string& name : golden_cases())
    cases.push_back(
        {name, join({"--weights", golden(name, "weights.safetensors"), "--input", golden(name, "input.npy")},
                    golden_args(name))});
  for (const std::string& name : entries(KVHEAD_MODELS_DIR)) {
    const fs::path folder = fs::path(KVHEAD_MODELS_DIR) / name;
    cases.push_back({name, join({"--model", folder.string(), "--input", (folder / "input.npy").string()},
                                split_words(read_bytes((folder / "args").string())))});
  }
  return cases;
}

TEST_CASE("precision_bf16_within_its_ceiling_of_f32_on_every_golden_case") {
  scratch_dir dir;
  double worst = 0.0;
  for (const layer_case& c : every_case()) {
    CAPTURE(c.name);
    const std::string f32 = dir.file(c.name + "-f32.npy"), bf16 = dir.file(c.name + "-bf16.npy");
    expect_clean_success(join({"run", "--output", f32}, c.flags));
    expect_clean_success(join({"run", "--output", bf16, "--precision", "bf16"}, c.flags));
    const io::npy_array reference = io::read_npy(f32), rounded = io::read_npy(bf16);
    REQUIRE(rounded.values.size() == reference.values.size());
    double largest = 0.0, difference = 0.0;
    for (std::size_t i = 0; i < reference.values.size(); ++i) {
      largest = std::max(largest, std::fabs(double(reference.values[i])));
      const double d = std::fabs(double(rounded.values[i]) - double(reference.values[i]));
      difference = std::isnan(d) ? d : std::max(difference, d);
    }
    const double relative = difference / largest;
    MESSAGE("bf16 vs f32 on " << c.name << ": max |diff| / max |f32| = " << relative);
    CHECK(relative <= 2e-2);
    CHECK(relative > 0.0);
    worst = std::max(worst, relative);
  }
  MESSAGE("bf16 vs f32, worst over the golden cases: " << worst);
}

// Under this CPU's configuration and, where the avx512 path runs, under a
// row of each choice of attention's bf16 products (avx512-2x512: vdpbf16ps
// where the CPU has it; avx512-xeon: the fp32 kernels), so both run here.
TEST_CASE("precision_bf16_same_bits_for_threads_and_decode_chunks") {
  scratch_dir dir;
  std::vector<std::string> configurations = {""};
  const std::vector<simd_path> paths = supported_simd_paths();
  if (std::find(paths.begin(), paths.end(), simd_path::avx512) != paths.end())
    configurations.insert(configurations.end(), {"avx512-2x512", "avx512-xeon"});
  for (const std::string& configuration : configurations) {
    CAPTURE(configuration);
    // A forced row names its path (KVHEAD_ISA cleared, whatever this test process was given).
    const std::vector<std::string> env =
        configuration.empty() ? std::vector<std::string>{}
                              : std::vector<std::string>{"KVHEAD_CONFIG=" + configuration, "KVHEAD_ISA="};
    for (const char* name : {"gqa_causal_rope", "bf16_prefix"}) {
      CAPTURE(name);
      const std::vector<std::string> flags = join({"--weights", golden(name, "weights.safetensors"), "--input",
                                                   golden(name, "input.npy"), "--precision", "bf16"},
                                                  golden_args(name));
      const std::string stem = dir.file(configuration + "-" + name);
      const std::string one = stem + "-1.npy", three = stem + "-3.npy";
      expect_clean_success(join({"run", "--output", one, "--threads", "1"}, flags), env);
      expect_clean_success(join({"run", "--output", three, "--threads", "3"}, flags), env);
      CHECK(read_bytes(one) == read_bytes(three));
      for (const char* dtype : {"f32", "bf16"}) {
        CAPTURE(dtype);
        const std::string decoded = stem + "-decode-" + dtype + ".npy";
        expect_clean_success(
            join({"decode", "--output", decoded, "--chunk", "7", "--threads", "2", "--kv-dtype", dtype}, flags), env);
        CHECK(read_bytes(decoded) == read_bytes(one));
      }
    }
  }
}

// A configuration of the avx2 path forced on an AVX-512 CPU (to reproduce
// a Zen 3's results) runs bf16 as that path's CPUs do, on the fp32 fallback:
// the bits of KVHEAD_ISA=avx2, not the avx512bf16 unit's.
TEST_CASE("precision_bf16_under_a_lower_configuration_is_that_paths") {
  const std::vector<simd_path> paths = supported_simd_paths();
  if (std::find(paths.begin(), paths.end(), simd_path::avx512) == paths.end() ||
      std::find(paths.begin(), paths.end(), simd_path::avx2) == paths.end()) {
    MESSAGE("SKIPPED: needs a CPU running both the avx512 and avx2 paths");
    return;
  }
  scratch_dir dir;
  const std::string name = "gqa_causal_rope";
  const std::vector<std::string> flags = join({"run", "--weights", golden(name, "weights.safetensors"), "--input",
                                               golden(name, "input.npy"), "--precision", "bf16"},
                                              golden_args(name));
  const std::string configured = dir.file("configured.npy"), forced = dir.file("forced.npy");
  expect_clean_success(join(flags, {"--output", configured}), {"KVHEAD_CONFIG=avx2-zen3", "KVHEAD_ISA="});
  expect_clean_success(join(flags, {"--output", forced}), {"KVHEAD_ISA=avx2"});
  CHECK(read_bytes(configured) == read_bytes(forced));
}

TEST_CASE("precision_must_be_known") {
  for (const char* command : {"run", "decode"})
    for (const char* text : {"fp16", "BF16", "", "all"}) {
      CAPTURE(command);
      CAPTURE(text);
      scratch_dir dir;
      const cli_result result = run_kvhead(join(
          {command, "--output", dir.file("y.npy"), std::string("--precision=") + text},
          join({"--weights", golden("mqa_causal", "weights.safetensors"), "--input", golden("mqa_causal", "input.npy")},
               golden_args("mqa_causal"))));
      CHECK(result.exit_code == 2);
      CHECK(result.err.find("--precision needs f32 or bf16") != std::string::npos);
      CHECK(entries(dir.path()).empty());
    }
}

}  // namespace
}  // namespace kvhead::cli_test
