// libFuzzer target: the command-line parser (tools/cli_args) with the flags of
// `kvhead run`, on arbitrary argument lists.
//
// The input is split at NUL bytes into argument words. parse_flags and every
// typed accessor either throw usage_error with a one-line message or return a
// value within the documented range; quote_arg always gives one quoted line.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tools/cli_args.hpp"
#include "tools/layer_job.hpp"

namespace {

using namespace kvhead::tools;

void check(bool property) {
  if (!property) std::abort();
}

bool one_line(std::string_view text) {
  for (const char ch : text)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) return false;
  return true;
}

/// Calls `accessor`; a usage_error is fine if its message is one line.
template <class F>
void try_accessor(F accessor) {
  try {
    accessor();
  } catch (const usage_error& error) {
    check(one_line(error.what()));
  }
}

void check_values(const parsed_flags& flags) {
  constexpr std::size_t max_count = 1000;
  for (const flag_spec& spec : layer_job_flags) {
    if (!spec.takes_value) continue;
    const std::string_view name = spec.name;
    try_accessor([&] {
      if (const auto count = flags.count(name, max_count)) check(*count >= 1 && *count <= max_count);
    });
    try_accessor([&] {
      if (const auto value = flags.finite_float(name)) check(std::isfinite(*value));
    });
    try_accessor([&] {
      if (const auto value = flags.non_negative_double(name)) check(std::isfinite(*value) && *value >= 0.0);
    });
    try_accessor([&] {
      const std::string text = flags.required(name);
      check(!text.empty() && flags.has(name));
    });
    if (const auto text = flags.value(name)) {
      const std::string quoted = quote_arg(*text);
      check(quoted.size() >= 2 && quoted.front() == '\'' && one_line(quoted));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words;
  std::string word;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      words.push_back(std::move(word));
      word.clear();
    } else {
      word += char(data[i]);
    }
  }
  words.push_back(std::move(word));
  std::vector<const char*> args;
  for (const std::string& text : words) args.push_back(text.c_str());
  try {
    const parsed_flags flags = parse_flags(args, layer_job_flags);
    check_values(flags);
  } catch (const usage_error& error) {
    check(one_line(error.what()));
  }
  return 0;
}
