// Helpers for the `kvhead run` tests (cli_test.cpp, cli_loader_test.cpp):
// a self-cleaning scratch folder, file builders that write bytes by hand
// (safetensors F32, .npy of any descr), and a runner that starts the built
// kvhead binary and captures its exit status, stdout and stderr.
#pragma once

#include <doctest/doctest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace kvhead::cli_test {

namespace fs = std::filesystem;

/// A fresh folder under the system temporary folder, removed with its
/// contents on destruction.
class scratch_dir {
 public:
  scratch_dir() {
    std::string pattern = (fs::temp_directory_path() / "kvhead-cli-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + pattern);
    path_ = pattern;
  }
  ~scratch_dir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Names of the entries of a folder, sorted.
inline std::vector<std::string> entries(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline std::size_t product(const std::vector<std::size_t>& shape) {
  std::size_t count = 1;
  for (std::size_t extent : shape) count *= extent;
  return count;
}

/// One F32 tensor for write_safetensors.
struct tensor {
  std::string name;  // plain ASCII, no quotes or backslashes
  std::vector<std::size_t> shape;
  std::vector<float> values;  // product(shape) values
};

/// A safetensors file of F32 tensors, laid out one after the other.
inline void write_safetensors(const std::string& path, const std::vector<tensor>& tensors) {
  std::string header = "{", data;
  for (const tensor& t : tensors) {
    REQUIRE(t.values.size() == product(t.shape));
    if (header.size() > 1) header += ",";
    header += "\"" + t.name + "\":{\"dtype\":\"F32\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i != 0) header += ",";
      header += std::to_string(t.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + ",";
    data.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
    header += std::to_string(data.size()) + "]}";
  }
  header += "}";
  std::string bytes(8, '\0');
  std::uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) bytes[std::size_t(i)] = char((length >> (8 * i)) & 0xff);
  write_bytes(path, bytes + header + data);
}

/// A .npy (version 1.0) with any descr; `data` is written as is.
inline void write_npy_raw(const std::string& path, const std::string& descr, const std::vector<std::size_t>& shape,
                          const std::string& data) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) dict += ", ";
    dict += std::to_string(shape[i]);
  }
  dict += shape.size() == 1 ? ",), }" : "), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += '\x01';
  bytes += '\x00';
  bytes += char(dict.size() & 0xff);
  bytes += char(dict.size() >> 8);
  write_bytes(path, bytes + dict + data);
}

/// The four projections of a layer (H heads, G kv heads, head_dim d), random
/// N(0, 1/d_model) values from `seed`, names prefixed; biases on request.
inline std::vector<tensor> layer_tensors(std::size_t heads, std::size_t kv_heads, std::size_t head_dim,
                                         std::size_t d_model, const std::string& prefix = "", bool bias = false,
                                         unsigned seed = 1) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(d_model)));
  std::vector<tensor> result;
  const std::pair<const char*, std::pair<std::size_t, std::size_t>> projections[] = {
      {"q_proj", {heads * head_dim, d_model}},
      {"k_proj", {kv_heads * head_dim, d_model}},
      {"v_proj", {kv_heads * head_dim, d_model}},
      {"o_proj", {d_model, heads * head_dim}}};
  for (const auto& [name, dims] : projections) {
    tensor weight{prefix + name + ".weight", {dims.first, dims.second}, {}};
    weight.values.resize(dims.first * dims.second);
    for (float& value : weight.values) value = normal(generator);
    result.push_back(std::move(weight));
    if (bias) {
      tensor b{prefix + name + ".bias", {dims.first}, std::vector<float>(dims.first)};
      for (float& value : b.values) value = normal(generator);
      result.push_back(std::move(b));
    }
  }
  return result;
}

/// Exit status and captured output of one kvhead process.
struct cli_result {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string out, err;
};

/// Runs the kvhead binary (KVHEAD_CLI_PATH) with `args`, stdin from
/// /dev/null; `env` entries ("NAME=value") replace or extend the environment.
inline cli_result run_kvhead(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  scratch_dir capture;
  const std::string out_path = capture.file("stdout"), err_path = capture.file("stderr");

  std::vector<std::string> words{KVHEAD_CLI_PATH};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);

  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    const bool replaced =
        std::any_of(env.begin(), env.end(), [&](const std::string& e) { return e.substr(0, e.find('=')) == name; });
    if (!replaced) environment.push_back(text);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) throw std::runtime_error(std::string("posix_spawn failed: ") + std::strerror(spawned));

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error("waitpid failed");
  cli_result result;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.out = read_bytes(out_path);
  result.err = read_bytes(err_path);
  return result;
}

/// tests/data/golden/<name>/<file>.
inline std::string golden(const std::string& name, const std::string& file) {
  return (fs::path(KVHEAD_GOLDEN_DIR) / name / file).string();
}

/// Every golden case folder name, sorted.
inline std::vector<std::string> golden_cases() { return entries(KVHEAD_GOLDEN_DIR); }

/// The flags in tests/data/golden/<name>/args, split on spaces.
inline std::vector<std::string> golden_args(const std::string& name) {
  std::vector<std::string> words;
  std::string text = read_bytes(golden(name, "args")), word;
  for (char ch : text) {
    if (ch == ' ' || ch == '\n' || ch == '\t') {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += ch;
    }
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

}  // namespace kvhead::cli_test
