#include "tools/cli_args.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <new>
#include <system_error>

#include "engine/io/file_error.hpp"

namespace kvhead::tools {

namespace {

const flag_spec* find_spec(std::span<const flag_spec> specs, std::string_view name) {
  for (const flag_spec& spec : specs)
    if (spec.name == name) return &spec;
  return nullptr;
}

/// Prints one line, "<command>: <message>", on stderr.
void print_error(std::string_view command, std::string_view message) {
  const std::string line = io::escape_controls(command) + ": " + io::escape_controls(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

template <class T>
bool parse_whole(std::string_view text, T& value) {
  const char* const end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  return error == std::errc() && stop == end;
}

}  // namespace

std::string quote_arg(std::string_view text) { return io::quote_name(text); }

std::optional<std::string> parsed_flags::value(std::string_view name) const {
  const auto found = values_.find(name);
  if (found == values_.end()) return std::nullopt;
  return found->second;
}

std::string parsed_flags::required(std::string_view name) const {
  const std::optional<std::string> text = value(name);
  if (!text) throw usage_error("missing required flag " + std::string(name));
  if (text->empty()) throw usage_error(std::string(name) + " needs a non-empty value");
  return *text;
}

std::optional<std::size_t> parsed_flags::count(std::string_view name, std::size_t max) const {
  const std::optional<std::string> text = value(name);
  if (!text) return std::nullopt;
  return parse_count(name, *text, max);
}

std::optional<float> parsed_flags::finite_float(std::string_view name) const {
  const std::optional<std::string> text = value(name);
  if (!text) return std::nullopt;
  return parse_finite_float(name, *text);
}

std::optional<double> parsed_flags::non_negative_double(std::string_view name) const {
  const std::optional<std::string> text = value(name);
  if (!text) return std::nullopt;
  return parse_non_negative_double(name, *text);
}

parsed_flags parse_flags(std::span<const char* const> args, std::span<const flag_spec> specs) {
  parsed_flags result;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view word = args[i];
    if (word == "--help" || word == "-h") {
      result.help_ = true;
      return result;
    }
    if (!word.starts_with("--")) throw usage_error("unexpected argument " + quote_arg(word));
    const std::size_t equals = word.find('=');
    const std::string_view name = word.substr(0, equals);
    const flag_spec* spec = find_spec(specs, name);
    if (spec == nullptr) throw usage_error("unknown flag " + quote_arg(name));
    if (result.has(name)) throw usage_error(std::string(name) + " is given twice");
    std::optional<std::string> value;
    if (!spec->takes_value) {
      if (equals != std::string_view::npos) throw usage_error(std::string(name) + " takes no value");
    } else if (equals != std::string_view::npos) {
      value = std::string(word.substr(equals + 1));
    } else if (i + 1 < args.size() && !std::string_view(args[i + 1]).starts_with("--")) {
      value = std::string(args[++i]);
    } else {
      throw usage_error(std::string(name) + " needs a value");
    }
    result.values_.emplace(std::string(name), std::move(value));
  }
  return result;
}

std::size_t parse_count(std::string_view flag, std::string_view text, std::size_t max) {
  std::size_t value = 0;
  const char* const end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  const bool digits_only = stop == end && !text.empty();
  if (digits_only && (error == std::errc::result_out_of_range || (error == std::errc() && value > max)))
    throw usage_error(std::string(flag) + " must be at most " + std::to_string(max) + ", got " + quote_arg(text));
  if (!digits_only || error != std::errc() || value == 0)
    throw usage_error(std::string(flag) + " needs a positive whole number, got " + quote_arg(text));
  return value;
}

float parse_finite_float(std::string_view flag, std::string_view text) {
  float value = 0.0f;
  if (parse_whole(text, value) && std::isfinite(value)) return value;
  double wide = 0.0;  // a finite number float cannot hold (from_chars: out of range)
  if (parse_whole(text, wide) && std::isfinite(wide))
    throw usage_error(std::string(flag) + " " + quote_arg(text) +
                      " is beyond float's range (magnitudes 1.4e-45 to 3.4e38)");
  throw usage_error(std::string(flag) + " needs a finite number, got " + quote_arg(text));
}

double parse_non_negative_double(std::string_view flag, std::string_view text) {
  double value = 0.0;
  if (!parse_whole(text, value) || !std::isfinite(value) || value < 0.0)
    throw usage_error(std::string(flag) + " needs a finite number >= 0, got " + quote_arg(text));
  return value;
}

int run_guarded(std::string_view command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const usage_error& error) {
    print_error(command, std::string(error.what()) + " (see " + std::string(command) + " --help)");
    return exit_usage;
  } catch (const std::bad_alloc&) {
    print_error(command, "out of memory");
  } catch (const std::exception& error) {
    // io::file_error ("<path>: <problem>"), std::invalid_argument from the
    // library, std::runtime_error (KVHEAD_ISA), ...
    print_error(command, error.what());
  } catch (...) {
    print_error(command, "unknown error");
  }
  return exit_failure;
}

}  // namespace kvhead::tools
