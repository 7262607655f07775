// `kvhead run` end to end: the built binary (KVHEAD_CLI_PATH) is started as a
// child process. Every failure case checks the whole error contract (exit
// code, exactly one line on stderr naming the problem, nothing on stdout, and
// the --output path untouched: a fresh path stays absent, an existing file
// keeps its bytes, no temporary is left behind). The numeric comparison with
// PyTorch is in the golden_<case> tests (cli_golden.cmake, npy_compare.cpp).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/arch/kernel_config.hpp"
#include "engine/gemm/gemm_bf16.hpp"
#include "engine/io/npy.hpp"
#include "kvhead/config.hpp"
#include "tests/cli_test_util.hpp"

namespace kvhead::cli_test {
namespace {

constexpr int exit_failure = 1, exit_usage = 2;

// A small golden case: MHA, H = G = 4, head_dim 8, d_model 32, input [2, 7, 32].
const std::string base_case = "mha_torch_mha";

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// --weights, --input and --heads for `name` (the golden case's own flags).
std::vector<std::string> golden_flags(const std::string& name = base_case) {
  return concat({"--weights", golden(name, "weights.safetensors"), "--input", golden(name, "input.npy")},
                golden_args(name));
}

/// The failure contract for one finished process.
void check_failure(const cli_result& result, int exit_code, const std::vector<std::string>& mentions) {
  INFO("stderr: " << result.err);
  INFO("stdout: " << result.out);
  CHECK(result.signal == 0);
  CHECK(result.exit_code == exit_code);
  CHECK(result.out.empty());
  CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
  CHECK(result.err.ends_with('\n'));
  CHECK(result.err.starts_with("kvhead run: "));
  for (const std::string& text : mentions)
    CHECK_MESSAGE(result.err.find(text) != std::string::npos, "mentions " << text);
}

/// Runs `kvhead run --output <path> <args>` twice, with no file at <path>
/// and with an existing one; both must fail with `exit_code` and a stderr
/// line containing every string of `mentions`, and leave <path> as it was.
void expect_failure(const std::vector<std::string>& args, int exit_code, const std::vector<std::string>& mentions,
                    const std::vector<std::string>& env = {}) {
  scratch_dir out_dir;
  const std::string fresh = out_dir.file("fresh.npy");
  {
    const cli_result result = run_kvhead(concat({"run", "--output", fresh}, args), env);
    check_failure(result, exit_code, mentions);
    CHECK(entries(out_dir.path()).empty());
  }
  const std::string existing = out_dir.file("existing.npy");
  const std::string sentinel = "not an npy file: must survive a failed run\n";
  write_bytes(existing, sentinel);
  {
    const cli_result result = run_kvhead(concat({"run", "--output", existing}, args), env);
    check_failure(result, exit_code, mentions);
    CHECK(read_bytes(existing) == sentinel);
    CHECK(entries(out_dir.path()) == std::vector<std::string>{"existing.npy"});
  }
}

/// `kvhead run` must succeed: exit 0, nothing on stdout or stderr.
void expect_success(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  const cli_result result = run_kvhead(concat({"run"}, args), env);
  INFO("stderr: " << result.err);
  CHECK(result.signal == 0);
  CHECK(result.exit_code == 0);
  CHECK(result.out.empty());
  CHECK(result.err.empty());
}

/// max|got - expected| / max|expected|; infinity on a shape or NaN mismatch.
double relative_error(const io::npy_array& got, const io::npy_array& expected) {
  if (got.shape != expected.shape) return std::numeric_limits<double>::infinity();
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < got.values.size(); ++i) {
    const double g = got.values[i], e = expected.values[i];
    if (std::isnan(g) != std::isnan(e)) return std::numeric_limits<double>::infinity();
    if (std::isnan(e)) continue;
    scale = std::fmax(scale, std::fabs(e));
    const double diff = std::fabs(g - e);
    worst = diff > worst || std::isnan(diff) ? diff : worst;
  }
  return scale > 0.0 ? worst / scale : worst;
}

// ------------------------------------------------------------ usage errors

TEST_CASE("unknown_flag") {
  expect_failure(concat(golden_flags(), {"--frobnicate", "3"}), exit_usage, {"--frobnicate"});
}

TEST_CASE("missing_required_flags") {
  SUBCASE("--weights") {
    expect_failure({"--input", golden(base_case, "input.npy"), "--heads", "4"}, exit_usage, {"--weights"});
  }
  SUBCASE("--input") {
    expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--heads", "4"}, exit_usage, {"--input"});
  }
  SUBCASE("--heads") {
    expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", golden(base_case, "input.npy")},
                   exit_usage, {"--heads"});
  }
  SUBCASE("--output") {
    const cli_result result = run_kvhead(concat({"run"}, golden_flags()));
    check_failure(result, exit_usage, {"--output"});
  }
}

TEST_CASE("heads_not_a_number") {
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", golden(base_case, "input.npy"),
                  "--heads", "abc"},
                 exit_usage, {"--heads", "'abc'"});
}

TEST_CASE("heads_zero") {
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", golden(base_case, "input.npy"),
                  "--heads", "0"},
                 exit_usage, {"--heads", "'0'"});
}

TEST_CASE("threads_zero") { expect_failure(concat(golden_flags(), {"--threads", "0"}), exit_usage, {"--threads"}); }

TEST_CASE("threads_zero_equals_form") {
  expect_failure(concat(golden_flags(), {"--threads=0"}), exit_usage, {"--threads", "'0'"});
}

TEST_CASE("flag_missing_value") {
  SUBCASE("at the end") {
    expect_failure(concat(golden_flags(), {"--threads"}), exit_usage, {"--threads needs a value"});
  }
  SUBCASE("followed by a flag") {
    expect_failure(concat({"--scale", "--causal"}, golden_flags()), exit_usage, {"--scale needs a value"});
  }
  SUBCASE("empty path") {
    expect_failure({"--weights=", "--input", golden(base_case, "input.npy"), "--heads", "4"}, exit_usage,
                   {"--weights"});
  }
}

TEST_CASE("counts_are_strict") {
  for (const char* text :
       {"12abc", "", "1e999", "1e3", "-3", "+3", " 3", "3 ", "4.0", "0x10", "99999999999999999999999", "inf", "nan"}) {
    CAPTURE(text);
    expect_failure(concat(golden_flags(), {std::string("--threads=") + text}), exit_usage, {"--threads"});
  }
  expect_failure(concat(golden_flags(), {"--threads", "1025"}), exit_usage, {"--threads", "1024"});
  expect_failure(concat(golden_flags(), {"--kv-heads", "-1"}), exit_usage, {"--kv-heads"});
}

TEST_CASE("scale_not_finite") {
  for (const char* text : {"nan", "inf", "-inf", "1e999", "1e39", "abc", "0.3x", ""}) {
    CAPTURE(text);
    expect_failure(concat(golden_flags(), {std::string("--scale=") + text}), exit_usage, {"--scale"});
  }
  // Finite, but not a float: named as such (not "needs a finite number").
  for (const char* text : {"1e39", "-1e39", "1e-50"}) {
    CAPTURE(text);
    expect_failure(concat(golden_flags(), {std::string("--scale=") + text}), exit_usage, {"beyond float's range"});
  }
}

TEST_CASE("rope_theta_negative_or_not_finite") {
  for (const char* text : {"-1", "-1e-30", "-inf", "inf", "nan", "1e999", "ten"}) {
    CAPTURE(text);
    expect_failure(concat(golden_flags(), {std::string("--rope-theta=") + text}), exit_usage, {"--rope-theta"});
  }
}

TEST_CASE("malformed_command_lines") {
  SUBCASE("switch with a value") {
    expect_failure(concat(golden_flags(), {"--causal=1"}), exit_usage, {"--causal takes no value"});
  }
  SUBCASE("flag given twice") {
    expect_failure(concat(golden_flags(), {"--heads", "4"}), exit_usage, {"--heads is given twice"});
  }
  SUBCASE("positional argument") {
    expect_failure(concat(golden_flags(), {"extra"}), exit_usage, {"unexpected argument 'extra'"});
  }
  SUBCASE("control characters are escaped") {
    expect_failure(concat(golden_flags(), {"--bad\nflag"}), exit_usage, {"--bad\\nflag"});
  }
}

TEST_CASE("unknown_command") {
  const cli_result result = run_kvhead({"frobnicate"});
  CHECK(result.exit_code == exit_usage);
  CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
  CHECK(result.err.find("'frobnicate'") != std::string::npos);
}

// ------------------------------------------------------ file and data errors

TEST_CASE("missing_weights_file") {
  scratch_dir dir;
  const std::string missing = dir.file("no-such.safetensors");
  expect_failure({"--weights", missing, "--input", golden(base_case, "input.npy"), "--heads", "4"}, exit_failure,
                 {missing, "cannot open"});
}

TEST_CASE("missing_input_file") {
  scratch_dir dir;
  const std::string missing = dir.file("no-such.npy");
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", missing, "--heads", "4"},
                 exit_failure, {missing, "cannot open"});
}

TEST_CASE("weights_not_safetensors") {
  scratch_dir dir;
  const std::string weights = dir.file("w.safetensors");
  const std::string good = read_bytes(golden(base_case, "weights.safetensors"));
  SUBCASE("garbage") { write_bytes(weights, std::string("\xff\x01garbage, not a safetensors file at all", 39)); }
  SUBCASE("truncated header") { write_bytes(weights, good.substr(0, 100)); }
  SUBCASE("truncated data") { write_bytes(weights, good.substr(0, good.size() - 5)); }
  SUBCASE("empty") { write_bytes(weights, ""); }
  SUBCASE("a folder") { fs::create_directory(weights); }
  expect_failure({"--weights", weights, "--input", golden(base_case, "input.npy"), "--heads", "4"}, exit_failure,
                 {weights});
}

TEST_CASE("input_not_npy") {
  scratch_dir dir;
  const std::string input = dir.file("x.npy");
  SUBCASE("garbage") { write_bytes(input, "this is not a .npy file"); }
  SUBCASE("truncated") {
    const std::string good = read_bytes(golden(base_case, "input.npy"));
    write_bytes(input, good.substr(0, good.size() - 3));
  }
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", input, "--heads", "4"},
                 exit_failure, {input});
}

TEST_CASE("input_dtype_f8") {
  scratch_dir dir;
  const std::string input = dir.file("x.npy");
  write_npy_raw(input, "<f8", {2, 7, 32}, std::string(2 * 7 * 32 * 8, '\0'));
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", input, "--heads", "4"},
                 exit_failure, {input, "<f8"});
}

TEST_CASE("input_rank") {
  scratch_dir dir;
  const std::string input = dir.file("x.npy");
  std::vector<std::size_t> shape;
  SUBCASE("rank 4") { shape = {1, 2, 7, 32}; }
  SUBCASE("rank 1") { shape = {32}; }
  SUBCASE("rank 0") { shape = {}; }
  const std::vector<float> values(product(shape), 0.5f);
  io::write_npy(input, shape, values.data());
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", input, "--heads", "4"},
                 exit_failure, {input, "rank " + std::to_string(shape.size())});
}

TEST_CASE("input_zero_tokens") {
  scratch_dir dir;
  const std::string input = dir.file("x.npy");
  std::vector<std::size_t> shape;
  SUBCASE("[0, 32]") { shape = {0, 32}; }
  SUBCASE("[2, 0, 32]") { shape = {2, 0, 32}; }
  SUBCASE("[0, 7, 32]") { shape = {0, 7, 32}; }
  io::write_npy(input, shape, nullptr);
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", input, "--heads", "4"},
                 exit_failure, {input, "no tokens"});
}

TEST_CASE("d_model_mismatch") {
  scratch_dir dir;
  const std::string input = dir.file("x.npy");
  const std::vector<float> values(2 * 7 * 31, 0.25f);
  io::write_npy(input, {2, 7, 31}, values.data());
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", input, "--heads", "4"},
                 exit_failure, {input, "d_model 31", "32"});
}

TEST_CASE("heads_not_divisible_by_kv_heads") {
  // H = 4 query heads, G = 3 kv heads of head_dim 2 (d_model 8).
  scratch_dir dir;
  const std::string weights = dir.file("w.safetensors"), input = dir.file("x.npy");
  write_safetensors(weights, layer_tensors(4, 3, 2, 8));
  const std::vector<float> values(5 * 8, 0.5f);
  io::write_npy(input, {5, 8}, values.data());
  expect_failure({"--weights", weights, "--input", input, "--heads", "4"}, exit_failure,
                 {weights, "num_heads 4 is not a multiple of num_kv_heads 3"});
  expect_failure({"--weights", weights, "--input", input, "--heads", "4", "--kv-heads", "3"}, exit_failure,
                 {weights, "not a multiple"});
}

TEST_CASE("kv_heads_disagree_with_file") {
  // gqa_causal_rope has G = 2.
  const std::vector<std::string> base = {"--weights", golden("gqa_causal_rope", "weights.safetensors"),
                                         "--input",   golden("gqa_causal_rope", "input.npy"),
                                         "--heads",   "8"};
  expect_failure(concat(base, {"--kv-heads", "4"}), exit_failure,
                 {"gqa_causal_rope", "num_kv_heads is 4", "2 kv heads"});
  expect_failure(concat(base, {"--kv-heads", "1"}), exit_failure, {"num_kv_heads is 1"});
}

TEST_CASE("heads_do_not_divide_q_proj") {
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", golden(base_case, "input.npy"),
                  "--heads", "5"},
                 exit_failure, {"q_proj.weight", "num_heads 5"});
  expect_failure({"--weights", golden(base_case, "weights.safetensors"), "--input", golden(base_case, "input.npy"),
                  "--heads", "4294967296"},
                 exit_failure, {"q_proj.weight"});
}

TEST_CASE("odd_head_dim_with_rope") {
  expect_failure(concat(golden_flags("odd_head_dim"), {"--rope-theta", "10000"}), exit_failure,
                 {"odd_head_dim", "even head_dim", "7"});
}

TEST_CASE("prefix_matches_nothing") {
  const std::vector<std::string> flags = {"--weights", golden("bf16_prefix", "weights.safetensors"),
                                          "--input",   golden("bf16_prefix", "input.npy"),
                                          "--heads",   "4"};
  expect_failure(concat(flags, {"--prefix", "model.layers.1."}), exit_failure,
                 {"bf16_prefix", "no tensor name starts with prefix 'model.layers.1.'",
                  "'model.layers.0.self_attn.k_proj.weight'"});
  // No prefix at all on a prefixed file: the names exist, q_proj.weight does not.
  expect_failure(flags, exit_failure, {"no tensor 'q_proj.weight'"});
}

TEST_CASE("output_not_writable") {
  scratch_dir dir;
  SUBCASE("missing folder") {
    const std::string output = dir.file("no-such-dir/y.npy");
    const cli_result result = run_kvhead(concat({"run", "--output", output}, golden_flags()));
    check_failure(result, exit_failure, {output, "does not exist"});
    CHECK(!fs::exists(dir.file("no-such-dir")));
  }
  SUBCASE("the input or the weights") {
    // Copies, so that a failure of the check cannot damage the goldens.
    const std::string weights = dir.file("w.safetensors"), input = dir.file("x.npy");
    fs::copy_file(golden(base_case, "weights.safetensors"), weights);
    fs::copy_file(golden(base_case, "input.npy"), input);
    const std::string weights_bytes = read_bytes(weights), input_bytes = read_bytes(input);
    const std::vector<std::string> flags = concat({"--weights", weights, "--input", input}, golden_args(base_case));
    for (const std::string& output : {input, weights, dir.file("./x.npy")}) {
      CAPTURE(output);
      check_failure(run_kvhead(concat({"run", "--output", output}, flags)), exit_failure,
                    {output, "this command reads: the output would destroy it"});
    }
    CHECK(read_bytes(weights) == weights_bytes);
    CHECK(read_bytes(input) == input_bytes);
  }
  SUBCASE("a folder") {
    const std::string output = dir.file("folder");
    fs::create_directory(output);
    const cli_result result = run_kvhead(concat({"run", "--output", output}, golden_flags()));
    check_failure(result, exit_failure, {output});
    CHECK(fs::is_directory(output));
    CHECK(entries(output).empty());
  }
}

TEST_CASE("bad_kvhead_isa") {
  expect_failure(golden_flags(), exit_failure, {"KVHEAD_ISA=neon", "unknown", "amx", "avx512bf16"},
                 {"KVHEAD_ISA=neon"});
  // A bf16 unit this CPU lacks is an error, as a path is (with the reason).
  for (const engine::bf16_unit unit : {engine::bf16_unit::amx, engine::bf16_unit::avx512bf16}) {
    if (engine::bf16_unit_runs_here(unit)) continue;
    const std::string isa = std::string("KVHEAD_ISA=") + engine::to_string(unit);
    expect_failure(golden_flags(), exit_failure, {isa, "cannot run"}, {isa});
    const cli_result version = run_kvhead({"--version"}, {isa});
    CHECK(version.exit_code == exit_failure);
    CHECK(version.out.empty());
    CHECK(version.err.find(isa + ": this CPU (or its OS) cannot run that bf16 unit") != std::string::npos);
  }
}

TEST_CASE("bad_kvhead_reduction_fails_before_any_work") {
  // The weights are missing too: the environment is checked first.
  expect_failure({"--weights", "/no/such.safetensors", "--input", golden(base_case, "input.npy"), "--heads", "4"},
                 exit_failure, {"KVHEAD_REDUCTION=sideways", "fixed or fastest"}, {"KVHEAD_REDUCTION=sideways"});
  const cli_result version = run_kvhead({"--version"}, {"KVHEAD_REDUCTION=sideways"});
  CHECK(version.exit_code == exit_failure);
  CHECK(version.err.find("KVHEAD_REDUCTION=sideways") != std::string::npos);
  const cli_result fastest = run_kvhead({"--version"}, {"KVHEAD_REDUCTION=fastest"});
  CHECK(fastest.out.find("reduction order: fastest") != std::string::npos);
  for (const char* informative : {"--version", "--help"}) {
    const cli_result extra = run_kvhead({informative, "bogus"});
    CHECK(extra.exit_code == exit_usage);
    CHECK(extra.err.find("takes no arguments, got 'bogus'") != std::string::npos);
  }
}

TEST_CASE("bad_kvhead_config") {
  SUBCASE("unknown name: the message lists the rows") {
    expect_failure(golden_flags(), exit_failure, {"KVHEAD_CONFIG=cray1", "unknown", "avx2"}, {"KVHEAD_CONFIG=cray1"});
  }
  SUBCASE("disagrees with KVHEAD_ISA") {
    expect_failure(golden_flags(), exit_failure, {"KVHEAD_CONFIG=sse2", "KVHEAD_ISA=avx2"},
                   {"KVHEAD_CONFIG=sse2", "KVHEAD_ISA=avx2"});
  }
  SUBCASE("a path this CPU cannot run") {
    const auto paths = supported_simd_paths();
    if (std::find(paths.begin(), paths.end(), simd_path::avx512) == paths.end())
      expect_failure(golden_flags(), exit_failure, {"KVHEAD_CONFIG=avx512-2x512", "avx512"},
                     {"KVHEAD_CONFIG=avx512-2x512"});
    else
      MESSAGE("skipped: this CPU runs every row's path");
  }
}

// ---------------------------------------------------------------- successes

TEST_CASE("equals_form_matches_space_form") {
  scratch_dir dir;
  const std::string spaced = dir.file("spaced.npy"), joined = dir.file("joined.npy");
  expect_success({"--weights", golden("gqa_causal_rope", "weights.safetensors"), "--input",
                  golden("gqa_causal_rope", "input.npy"), "--output", spaced, "--heads", "8", "--kv-heads", "2",
                  "--causal", "--rope-theta", "10000", "--threads", "2"});
  expect_success({"--weights=" + golden("gqa_causal_rope", "weights.safetensors"),
                  "--input=" + golden("gqa_causal_rope", "input.npy"), "--output=" + joined, "--heads=8",
                  "--kv-heads=2", "--causal", "--rope-theta=1e4", "--threads=2", "--prefix="});
  CHECK(read_bytes(spaced) == read_bytes(joined));
  CHECK(relative_error(io::read_npy(joined), io::read_npy(golden("gqa_causal_rope", "expected.npy"))) <= 1e-4);
}

TEST_CASE("alibi_flag_decodes_as_it_runs_and_changes_the_output") {
  scratch_dir dir;
  const std::vector<std::string> flags = {"--weights",  golden("gqa_causal_rope", "weights.safetensors"),
                                          "--input",    golden("gqa_causal_rope", "input.npy"),
                                          "--heads",    "8",
                                          "--kv-heads", "2"};
  const std::string plain = dir.file("plain.npy"), alibi = dir.file("alibi.npy");
  expect_success(concat(flags, {"--causal", "--output", plain}));
  expect_success(concat(flags, {"--causal", "--alibi", "8", "--output", alibi}));
  CHECK(read_bytes(plain) != read_bytes(alibi));
  for (const char* chunk : {"1", "3"}) {
    CAPTURE(chunk);
    const std::string decoded = dir.file(std::string("decoded-") + chunk + ".npy");
    const cli_result result =
        run_kvhead(concat({"decode"}, concat(flags, {"--alibi", "8", "--chunk", chunk, "--output", decoded})));
    INFO("stderr: " << result.err);
    CHECK(result.exit_code == 0);
    CHECK(read_bytes(decoded) == read_bytes(alibi));
  }
  expect_failure(concat(flags, {"--alibi", "0"}), exit_usage, {"--alibi needs a max bias above 0"});
  expect_failure(concat(flags, {"--alibi", "-8"}), exit_usage, {"--alibi"});
}

TEST_CASE("kv_heads_optional") {
  scratch_dir dir;
  const std::string output = dir.file("y.npy");
  expect_success({"--weights", golden("gqa_causal_rope", "weights.safetensors"), "--input",
                  golden("gqa_causal_rope", "input.npy"), "--output", output, "--heads", "8", "--causal",
                  "--rope-theta", "10000"});
  CHECK(relative_error(io::read_npy(output), io::read_npy(golden("gqa_causal_rope", "expected.npy"))) <= 1e-4);
}

TEST_CASE("rank_2_input_is_batch_1") {
  // Sequence 1 of mha_torch_mha as a [7, 32] input gives row block 1 of the
  // [2, 7, 32] run, bit for bit, with shape [7, 32].
  scratch_dir dir;
  const io::npy_array input = io::read_npy(golden(base_case, "input.npy"));
  const std::string single = dir.file("x.npy"), both_out = dir.file("both.npy"), single_out = dir.file("one.npy");
  io::write_npy(single, {7, 32}, input.values.data() + 7 * 32);
  expect_success(concat({"--output", both_out}, golden_flags()));
  expect_success({"--weights", golden(base_case, "weights.safetensors"), "--input", single, "--output", single_out,
                  "--heads", "4"});
  const io::npy_array both = io::read_npy(both_out), one = io::read_npy(single_out);
  REQUIRE(one.shape == std::vector<std::size_t>{7, 32});
  CHECK(std::equal(one.values.begin(), one.values.end(), both.values.begin() + 7 * 32));
}

TEST_CASE("overwrites_existing_output") {
  scratch_dir dir;
  const std::string output = dir.file("y.npy");
  write_bytes(output, "old contents");
  expect_success(concat({"--output", output}, golden_flags()));
  CHECK(relative_error(io::read_npy(output), io::read_npy(golden(base_case, "expected.npy"))) <= 1e-4);
  CHECK(entries(dir.path()) == std::vector<std::string>{"y.npy"});
}

/// Runs base_case's layer (optionally causal) on its input with one NaN at
/// (batch 0, token `t`, feature 5); returns the output and the clean output.
std::pair<io::npy_array, io::npy_array> run_with_nan(bool causal, std::size_t t, float poison) {
  scratch_dir dir;
  io::npy_array input = io::read_npy(golden(base_case, "input.npy"));
  REQUIRE(input.shape == std::vector<std::size_t>{2, 7, 32});
  const std::string clean_in = dir.file("clean.npy"), poisoned_in = dir.file("poisoned.npy");
  io::write_npy(clean_in, input.shape, input.values.data());
  input.values[t * 32 + 5] = poison;
  io::write_npy(poisoned_in, input.shape, input.values.data());
  std::vector<std::string> flags = {"--weights", golden(base_case, "weights.safetensors"), "--heads", "4"};
  if (causal) flags.push_back("--causal");
  expect_success(concat(flags, {"--input", clean_in, "--output", dir.file("clean_out.npy")}));
  expect_success(concat(flags, {"--input", poisoned_in, "--output", dir.file("poisoned_out.npy")}));
  return {io::read_npy(dir.file("poisoned_out.npy")), io::read_npy(dir.file("clean_out.npy"))};
}

/// True when every feature of output row (batch 0, token `t`) is NaN
/// (`nan_only`) or non-finite.
bool row_poisoned(const io::npy_array& output, std::size_t t, bool nan_only) {
  for (std::size_t f = 0; f < 32; ++f) {
    const float value = output.values[t * 32 + f];
    if (nan_only ? !std::isnan(value) : std::isfinite(value)) return false;
  }
  return true;
}

TEST_CASE("nan_in_input_causal") {
  // Token t poisons outputs at positions >= t of its own sequence only; the
  // other outputs equal the clean run bit for bit. (Position t itself:
  // non_finite_token_reaches_its_own_output.)
  const std::size_t t = 3;
  const auto [got, clean] = run_with_nan(true, t, std::numeric_limits<float>::quiet_NaN());
  for (std::size_t s = 0; s < 7; ++s) {
    CAPTURE(s);
    if (s > t) CHECK(row_poisoned(got, s, true));
  }
  for (std::size_t i = 0; i < t * 32; ++i) CHECK(got.values[i] == clean.values[i]);
  for (std::size_t i = 7 * 32; i < 2 * 7 * 32; ++i) CHECK(got.values[i] == clean.values[i]);
}

TEST_CASE("nan_and_inf_in_input_not_causal") {
  // Without a mask every token of sequence 0 attends to token t; sequence 1
  // is untouched.
  const std::size_t t = 6;
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(poison);
    const auto [got, clean] = run_with_nan(false, t, poison);
    for (std::size_t s = 0; s < t; ++s) {
      CAPTURE(s);
      CHECK(row_poisoned(got, s, false));
    }
    for (std::size_t i = 7 * 32; i < 2 * 7 * 32; ++i) CHECK(got.values[i] == clean.values[i]);
  }
}

TEST_CASE("non_finite_token_reaches_its_own_output") {
  // The token's own query is NaN (or infinite): every score of that row is
  // NaN, so its output must be NaN too (PyTorch gives NaN). For causal t = 0
  // the only key it sees is its own.
  struct poisoned {
    bool causal;
    std::size_t t;
    float value;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const poisoned& p :
       {poisoned{true, 3, nan}, poisoned{true, 0, nan}, poisoned{false, 6, nan}, poisoned{false, 6, inf}}) {
    CAPTURE(p.causal);
    CAPTURE(p.t);
    CAPTURE(p.value);
    const auto [got, clean] = run_with_nan(p.causal, p.t, p.value);
    CHECK(row_poisoned(got, p.t, false));
  }
}

// Every row of the configuration table that runs here gives the bits of its
// path's default (KC alone orders the sums; MR, NR, MC, NC never do).
TEST_CASE("forced_configuration_keeps_the_bits_of_its_path") {
  scratch_dir dir;
  for (simd_path path : supported_simd_paths()) {
    const std::string isa = to_string(path);
    const std::string by_path = dir.file("path-" + isa + ".npy");
    expect_success(concat({"--output", by_path}, golden_flags("mha_long_causal_rope")), {"KVHEAD_ISA=" + isa});
    for (const engine::kernel_config_row& table_row : engine::kernel_config_rows) {
      if (table_row.path != path) continue;
      const std::string row = table_row.name;
      CAPTURE(row);
      const std::string forced = dir.file("row-" + row + ".npy");
      // KVHEAD_ISA cleared: the row names its path, whatever path this test process was given.
      expect_success(concat({"--output", forced}, golden_flags("mha_long_causal_rope")),
                     {"KVHEAD_CONFIG=" + row, "KVHEAD_ISA="});
      CHECK(read_bytes(forced) == read_bytes(by_path));
    }
  }
}

TEST_CASE("threads_do_not_change_the_result") {
  scratch_dir dir;
  std::string first;
  for (const char* threads : {"1", "2", "3", "8"}) {
    CAPTURE(threads);
    const std::string output = dir.file(std::string("y") + threads + ".npy");
    expect_success(concat({"--output", output, "--threads", threads}, golden_flags("mha_long_causal_rope")));
    if (first.empty())
      first = read_bytes(output);
    else
      CHECK(read_bytes(output) == first);
  }
}

TEST_CASE("every_simd_path_matches_golden") {
  scratch_dir dir;
  for (simd_path path : supported_simd_paths()) {
    for (const std::string& name : golden_cases()) {
      CAPTURE(to_string(path));
      CAPTURE(name);
      const std::string output = dir.file(name + "-" + to_string(path) + ".npy");
      expect_success(concat({"--output", output}, golden_flags(name)), {std::string("KVHEAD_ISA=") + to_string(path)});
      CHECK(relative_error(io::read_npy(output), io::read_npy(golden(name, "expected.npy"))) <= 1e-4);
    }
  }
}

TEST_CASE("help") {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"run", "--help"}, {"run", "-h"}, {"run", "--heads", "4", "--help"}}) {
    CAPTURE(args.size());
    const cli_result result = run_kvhead(args);
    CHECK(result.exit_code == 0);
    CHECK(result.err.empty());
    for (const char* text : {"--weights", "--input", "--output", "--heads", "--kv-heads", "--causal", "--rope-theta",
                             "--prefix", "--scale", "--threads", "KVHEAD_ISA", "exit status", "  1  ", "  2  "})
      CHECK_MESSAGE(result.out.find(text) != std::string::npos, "help mentions " << text);
  }
}

TEST_CASE("version") {
  const cli_result result = run_kvhead({"--version"});
  CHECK(result.exit_code == 0);
  CHECK(result.err.empty());
  CHECK(result.out.starts_with(std::string("kvhead ") + version()));
  CHECK(result.out.find(std::string("bf16 unit: ") + engine::to_string(engine::active_bf16_unit())) !=
        std::string::npos);
  // An fp32 level of KVHEAD_ISA leaves bf16 on the fallback, and says so.
  const cli_result limited = run_kvhead({"--version"}, {"KVHEAD_ISA=sse2"});
  CHECK(limited.exit_code == 0);
  CHECK(limited.out.find("bf16 unit: fp32_fallback") != std::string::npos);
  CHECK(limited.out.find("KVHEAD_ISA=sse2 limits bf16") != std::string::npos);
}

TEST_CASE("demo_flags") {
  const cli_result help = run_kvhead({"demo", "--help"});
  CHECK(help.exit_code == 0);
  const cli_result bad = run_kvhead({"demo", "--threads", "0"});
  CHECK(bad.exit_code == exit_usage);
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
}

}  // namespace
}  // namespace kvhead::cli_test
