// `kvhead decode` end to end (the built binary as a child process): its output
// is byte-identical to `kvhead run --causal` for any --chunk, --block-size and
// --threads, it
// shares run's error contract (exit code, one stderr line, --output
// untouched), and its help.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/npy.hpp"
#include "tests/cli_test_util.hpp"

namespace kvhead::cli_test {
namespace {

constexpr int exit_failure = 1, exit_usage = 2;

std::vector<std::string> join(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// `command` must succeed with nothing on stdout or stderr.
void expect_clean_success(const std::vector<std::string>& args) {
  const cli_result result = run_kvhead(args);
  INFO("args: " << args.front() << " ... stderr: " << result.err);
  CHECK(result.signal == 0);
  CHECK(result.exit_code == 0);
  CHECK(result.out.empty());
  CHECK(result.err.empty());
}

/// The golden case's flags with --causal (added when its args lack it).
std::vector<std::string> causal_flags(const std::string& name) {
  std::vector<std::string> flags =
      join({"--weights", golden(name, "weights.safetensors"), "--input", golden(name, "input.npy")}, golden_args(name));
  if (std::find(flags.begin(), flags.end(), "--causal") == flags.end()) flags.push_back("--causal");
  return flags;
}

/// `kvhead run` with `flags` (which include --causal), then decode with each
/// of the chunk/thread variants; every output must equal run's byte for byte.
void check_decode_equals_run(const std::vector<std::string>& flags) {
  scratch_dir dir;
  const std::string expected = dir.file("run.npy");
  expect_clean_success(join({"run", "--output", expected}, flags));
  const std::string reference = read_bytes(expected);
  REQUIRE(!reference.empty());
  const std::vector<std::vector<std::string>> variants = {{"--chunk", "1", "--threads", "2"},
                                                          {"--chunk", "7", "--threads", "1"},
                                                          {"--chunk", "1000"},
                                                          {"--chunk", "3", "--block-size", "16"},
                                                          {"--chunk", "999", "--block-size", "32", "--threads", "2"}};
  for (const std::vector<std::string>& variant : variants) {
    CAPTURE(variant[1]);
    const std::string output = dir.file("decode-" + variant[1] + ".npy");
    expect_clean_success(join(join({"decode", "--output", output}, flags), variant));
    CHECK(read_bytes(output) == reference);
  }
}

// ------------------------------------------------------------ bit identity

TEST_CASE("decode_bit_identical_to_run_causal_on_golden_cases") {
  // Every golden case: the causal ones as they are, the others with --causal
  // added (MHA, F16 with --scale, odd head_dim 7 with MQA).
  const std::vector<std::string> cases = golden_cases();
  REQUIRE(cases.size() >= 5);
  for (const std::string& name : cases) {
    CAPTURE(name);
    check_decode_equals_run(causal_flags(name));
  }
}

TEST_CASE("decode_bit_identical_across_cache_blocks") {
  // Sequences longer than one 256-token cache block, GQA 4:2 with RoPE and
  // biases, batch 2: chunks straddle block boundaries.
  scratch_dir dir;
  const std::string weights = dir.file("w.safetensors"), input = dir.file("x.npy");
  write_safetensors(weights, layer_tensors(4, 2, 8, 24, "", true, 7));
  std::mt19937 generator(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(2 * 300 * 24);
  for (float& value : values) value = normal(generator);
  io::write_npy(input, {2, 300, 24}, values.data());
  check_decode_equals_run(
      {"--weights", weights, "--input", input, "--heads", "4", "--causal", "--rope-theta", "10000"});
}

TEST_CASE("decode_kv_dtype_same_bits_for_any_chunk_and_threads_close_to_f32") {
  // GQA with RoPE; for each compressed dtype the output is the same for any
  // --chunk and --threads, and within the dtype's accuracy ceiling of the
  // f32 result (kv_cache.hpp: bf16 1e-2, f16 2e-3, int8 3e-2).
  scratch_dir dir;
  const std::vector<std::string> flags = causal_flags("gqa_causal_rope");
  const std::string f32 = dir.file("f32.npy");
  expect_clean_success(join({"decode", "--output", f32, "--kv-dtype", "f32"}, flags));
  const io::npy_array reference = io::read_npy(f32);
  float reference_max = 0.0f;
  for (const float value : reference.values) reference_max = std::max(reference_max, std::fabs(value));
  for (const auto& dtype_ceiling : {std::pair{"bf16", 1e-2}, std::pair{"f16", 2e-3}, std::pair{"int8", 3e-2}}) {
    const std::string dtype = dtype_ceiling.first;
    const double ceiling = dtype_ceiling.second;
    CAPTURE(dtype);
    const std::string one = dir.file(dtype + "-1.npy"), seven = dir.file(dtype + "-7.npy");
    expect_clean_success(join(join({"decode", "--output", one, "--kv-dtype", dtype}, flags), {"--threads", "2"}));
    expect_clean_success(join(join({"decode", "--output", seven, "--kv-dtype", dtype}, flags), {"--chunk", "7"}));
    CHECK(read_bytes(one) == read_bytes(seven));
    const std::string small_blocks = dir.file(dtype + "-16.npy");
    expect_clean_success(
        join(join({"decode", "--output", small_blocks, "--kv-dtype", dtype}, flags), {"--block-size", "16"}));
    CHECK(read_bytes(one) == read_bytes(small_blocks));
    const io::npy_array decoded = io::read_npy(one);
    REQUIRE(decoded.values.size() == reference.values.size());
    double difference = 0.0;
    for (std::size_t i = 0; i < decoded.values.size(); ++i)
      difference = std::max(difference, std::fabs(double(decoded.values[i]) - double(reference.values[i])));
    CHECK(difference / reference_max <= ceiling);
  }
  CHECK(read_bytes(f32) == [&] {
    const std::string run = dir.file("run.npy");
    expect_clean_success(join({"run", "--output", run}, flags));
    return read_bytes(run);
  }());
}

TEST_CASE("decode_causal_flag_is_implied") {
  scratch_dir dir;
  const std::vector<std::string> flags = {"--weights",    golden("gqa_causal_rope", "weights.safetensors"),
                                          "--input",      golden("gqa_causal_rope", "input.npy"),
                                          "--heads",      "8",
                                          "--rope-theta", "10000"};
  expect_clean_success(join({"decode", "--output", dir.file("with.npy"), "--causal"}, flags));
  expect_clean_success(join({"decode", "--output", dir.file("without.npy"), "--chunk=3"}, flags));
  CHECK(read_bytes(dir.file("with.npy")) == read_bytes(dir.file("without.npy")));
}

// ----------------------------------------------------------- error contract

/// Runs `kvhead decode --output <path> <args>` with no file at <path> and with
/// an existing one: both fail with `exit_code`, one stderr line starting with
/// "kvhead decode: " and containing every `mentions`, nothing on stdout, and
/// <path> as it was.
void expect_decode_failure(const std::vector<std::string>& args, int exit_code,
                           const std::vector<std::string>& mentions, const std::vector<std::string>& env = {}) {
  scratch_dir out_dir;
  const std::string sentinel = "not an npy file: must survive a failed decode\n";
  for (const bool existing : {false, true}) {
    CAPTURE(existing);
    const std::string output = out_dir.file(existing ? "existing.npy" : "fresh.npy");
    if (existing) write_bytes(output, sentinel);
    const cli_result result = run_kvhead(join({"decode", "--output", output}, args), env);
    INFO("stderr: " << result.err);
    CHECK(result.signal == 0);
    CHECK(result.exit_code == exit_code);
    CHECK(result.out.empty());
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK(result.err.starts_with("kvhead decode: "));
    for (const std::string& text : mentions)
      CHECK_MESSAGE(result.err.find(text) != std::string::npos, "mentions " << text);
    if (existing) {
      CHECK(read_bytes(output) == sentinel);
      CHECK(entries(out_dir.path()) == std::vector<std::string>{"existing.npy"});
    } else {
      CHECK(entries(out_dir.path()).empty());
    }
  }
}

TEST_CASE("decode_chunk_must_be_a_positive_number") {
  for (const char* text : {"0", "abc", "-1", "+1", "1.5", "", "2x"}) {
    CAPTURE(text);
    expect_decode_failure(join(causal_flags("mqa_causal"), {std::string("--chunk=") + text}), exit_usage, {"--chunk"});
  }
  expect_decode_failure(join(causal_flags("mqa_causal"), {"--chunk", "0"}), exit_usage, {"--chunk", "'0'"});
  expect_decode_failure(join(causal_flags("mqa_causal"), {"--chunk"}), exit_usage, {"--chunk needs a value"});
}

TEST_CASE("decode_kv_dtype_must_be_known") {
  for (const char* text : {"fp8", "F16", "", "float"})
    expect_decode_failure(join(causal_flags("mqa_causal"), {std::string("--kv-dtype=") + text}), exit_usage,
                          {"--kv-dtype"});
  expect_decode_failure(join(causal_flags("mqa_causal"), {"--kv-dtype", "q4"}), exit_usage, {"--kv-dtype", "'q4'"});
  expect_decode_failure(join(causal_flags("mqa_causal"), {"--kv-dtype", "all"}), exit_usage, {"--kv-dtype", "'all'"});
}

TEST_CASE("decode_block_size_must_be_one_the_cache_takes") {
  for (const char* text : {"0", "7", "8", "512", "016", "+16", "16.0", "", "all"}) {
    CAPTURE(text);
    expect_decode_failure(join(causal_flags("mqa_causal"), {std::string("--block-size=") + text}), exit_usage,
                          {"--block-size needs 16, 32, 64, 128 or 256, got '" + std::string(text) + "'"});
  }
  expect_decode_failure(join(causal_flags("mqa_causal"), {"--block-size"}), exit_usage, {"--block-size needs a value"});
}

TEST_CASE("decode_run_errors") {
  scratch_dir dir;
  const std::string missing = dir.file("no-such.safetensors");
  SUBCASE("missing weights file") {
    expect_decode_failure({"--weights", missing, "--input", golden("mqa_causal", "input.npy"), "--heads", "6"},
                          exit_failure, {missing, "cannot open"});
  }
  SUBCASE("missing input file") {
    expect_decode_failure(
        {"--weights", golden("mqa_causal", "weights.safetensors"), "--input", missing, "--heads", "6"}, exit_failure,
        {missing, "cannot open"});
  }
  SUBCASE("kv heads disagree with the file") {
    // gqa_causal_rope has G = 2.
    expect_decode_failure({"--weights", golden("gqa_causal_rope", "weights.safetensors"), "--input",
                           golden("gqa_causal_rope", "input.npy"), "--heads", "8", "--kv-heads", "4"},
                          exit_failure, {"gqa_causal_rope", "num_kv_heads is 4"});
  }
  SUBCASE("missing --heads") {
    expect_decode_failure(
        {"--weights", golden("mqa_causal", "weights.safetensors"), "--input", golden("mqa_causal", "input.npy")},
        exit_usage, {"--heads"});
  }
  SUBCASE("unknown flag") {
    expect_decode_failure(join(causal_flags("mqa_causal"), {"--tokens", "3"}), exit_usage, {"--tokens"});
  }
  SUBCASE("bad KVHEAD_ISA") {
    expect_decode_failure(causal_flags("mqa_causal"), exit_failure, {"KVHEAD_ISA=neon"}, {"KVHEAD_ISA=neon"});
  }
}

TEST_CASE("decode_output_folder_missing") {
  scratch_dir dir;
  const std::string output = dir.file("no-such-dir/y.npy");
  const cli_result result = run_kvhead(join({"decode", "--output", output}, causal_flags("mqa_causal")));
  CHECK(result.exit_code == exit_failure);
  CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
  CHECK(result.err.find("does not exist") != std::string::npos);
  CHECK(!fs::exists(dir.file("no-such-dir")));
}

// -------------------------------------------------------------------- help

TEST_CASE("decode_help") {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"decode", "--help"}, {"decode", "-h"}, {"--help"}}) {
    CAPTURE(args.front());
    const cli_result result = run_kvhead(args);
    CHECK(result.exit_code == 0);
    CHECK(result.err.empty());
    for (const char* text :
         {"kvhead decode", "--chunk", "--block-size", "--causal", "--weights", "--threads", "bit-identical"})
      CHECK_MESSAGE(result.out.find(text) != std::string::npos, "help mentions " << text);
  }
  const cli_result full = run_kvhead({"decode", "--help"});
  for (const char* text : {"exit status", "KVHEAD_ISA", "--rope-theta", "--prefix", "--scale"})
    CHECK_MESSAGE(full.out.find(text) != std::string::npos, "decode --help mentions " << text);
}

}  // namespace
}  // namespace kvhead::cli_test
