// Command-line flags shared by the kvhead commands (run, decode, demo, kernels):
// parsing, strict number conversion, and the exit-code contract.
//
// Syntax. Every flag is long ("--name"). A flag that takes a value accepts
// "--name value" and "--name=value"; in the first form a following word that
// starts with "--" is not taken as the value (so "--heads --causal" reports
// the missing value; write "--prefix=--odd" for such a value). A switch
// ("--causal") takes no value. "--help" or "-h" stops parsing and asks for the
// help text. Anything else is a usage_error: an unknown flag, a flag given
// twice, a flag missing its value, a switch given a value, a positional word.
//
// Numbers are strict: the whole text must parse (std::from_chars: no spaces,
// no sign on counts, no hex), within range, and pass the flag's own check.
//
// Exit codes (run_guarded): 0 success; 2 usage_error; 1 anything else
// (io::file_error, std::invalid_argument from the library, std::bad_alloc as
// "out of memory", any other std::exception). Every failure prints exactly
// one line on stderr, "<command>: <message>", control characters escaped.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvhead::tools {

inline constexpr int exit_ok = 0;
inline constexpr int exit_failure = 1;  // file and data errors
inline constexpr int exit_usage = 2;    // command-line mistakes

/// A mistake on the command line: exit 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One flag a command accepts.
struct flag_spec {
  std::string_view name;  // with the dashes: "--heads"
  bool takes_value;       // false: a switch such as "--causal"
};

/// The flags of one command line, syntax-checked against a flag_spec list.
class parsed_flags {
 public:
  /// "--help" or "-h" was seen (parsing stopped there).
  bool help() const { return help_; }
  /// The flag was given (switch or value flag).
  bool has(std::string_view name) const { return values_.find(name) != values_.end(); }
  /// A value flag's text; nullopt when absent.
  std::optional<std::string> value(std::string_view name) const;
  /// A value flag's text; usage_error when absent or empty.
  std::string required(std::string_view name) const;

  /// Optional typed values (nullopt when absent); usage_error on bad text.
  std::optional<std::size_t> count(std::string_view name, std::size_t max) const;
  std::optional<float> finite_float(std::string_view name) const;
  std::optional<double> non_negative_double(std::string_view name) const;

 private:
  friend parsed_flags parse_flags(std::span<const char* const>, std::span<const flag_spec>);
  bool help_ = false;
  std::map<std::string, std::optional<std::string>, std::less<>> values_;  // nullopt: a switch
};

/// Parses `args` (the words after the command name). Throws usage_error.
parsed_flags parse_flags(std::span<const char* const> args, std::span<const flag_spec> specs);

/// A whole number in [1, max]; usage_error naming `flag` otherwise
/// ("12abc", "", "-3", "+3", "4.0", "1e3", out of range, 0).
std::size_t parse_count(std::string_view flag, std::string_view text, std::size_t max);
/// A finite float (decimal or scientific: "0.3", "1e-2"); not nan, inf or
/// beyond float's range.
float parse_finite_float(std::string_view flag, std::string_view text);
/// A finite double >= 0.
double parse_non_negative_double(std::string_view flag, std::string_view text);

/// The largest --threads accepted.
inline constexpr std::size_t max_threads = 1024;

/// Runs `body` and returns its exit code; maps an escaping exception to the
/// exit codes above and prints one line on stderr prefixed by `command`
/// ("kvhead run"). A usage_error line ends with "(see <command> --help)".
int run_guarded(std::string_view command, const std::function<int()>& body);

/// `text` on one line, quoted ('...'), control characters escaped: for
/// echoing user input in a message.
std::string quote_arg(std::string_view text);

/// "a", "a or b", "a, b or c": the names as a help text or a message lists them.
inline std::string or_list(const std::vector<std::string>& names) {
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i)
    list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return list;
}

/// The one of `values` whose to_string() is `text` (a named flag value:
/// --precision, --kv-dtype); a usage_error otherwise, "<flag> needs a, b or
/// c, got '<text>'", listing also_accepted last when given (a word the
/// caller handles itself, such as "all").
template <class Values>
std::ranges::range_value_t<Values> parse_named(std::string_view flag, const Values& values, std::string_view text,
                                               std::string_view also_accepted = {}) {
  std::vector<std::string> names;
  for (const auto value : values) {
    if (text == to_string(value)) return value;
    names.emplace_back(to_string(value));
  }
  if (!also_accepted.empty()) names.emplace_back(also_accepted);
  throw usage_error(std::string(flag) + " needs " + or_list(names) + ", got " + quote_arg(text));
}

}  // namespace kvhead::tools
