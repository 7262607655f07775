#include "engine/io/json_file.hpp"

#include <set>
#include <vector>

#include "engine/io/file_error.hpp"
#include "engine/io/regular_file.hpp"

namespace kvhead::io {

namespace {

constexpr std::size_t max_json_bytes = std::size_t{64} << 20;

std::string read_whole(const std::string& path) {
  const regular_file file(path, "a JSON file");
  if (file.size() > max_json_bytes)
    throw file_error(path, "is " + std::to_string(file.size()) + " bytes, more than a JSON file here may be (" +
                               std::to_string(max_json_bytes) + ")");
  std::string text(file.size(), '\0');
  file.read_exact(text.data(), text.size(), 0);
  return text;
}

}  // namespace

std::string json_type_name(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    default:
      return "a number";
  }
}

std::string json_value_text(const nlohmann::json& value) {
  if (value.is_string()) return quote_name(value.get_ref<const std::string&>());
  if (value.is_structured()) return json_type_name(value);
  return value.dump();
}

nlohmann::json read_json_object(const std::string& path) {
  const std::string text = read_whole(path);
  // nlohmann skips a byte order mark; JSON (RFC 8259) and Python's json,
  // which Hugging Face reads config.json with, refuse it.
  if (text.starts_with("\xEF\xBB\xBF"))
    throw file_error(path, "is not valid JSON: it begins with a UTF-8 byte order mark");
  // Keys seen in each open object, innermost last.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const nlohmann::json::parser_callback_t reject_duplicates = [&](int, nlohmann::json::parse_event_t event,
                                                                  nlohmann::json& parsed) {
    using event_t = nlohmann::json::parse_event_t;
    if (event == event_t::object_start) open_objects.emplace_back();
    if (event == event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == event_t::key && !open_objects.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text, reject_duplicates);
  } catch (const nlohmann::json::exception& error) {
    throw file_error(path, std::string("is not valid JSON: ") + error.what());
  }
  if (!duplicate.empty()) throw file_error(path, "key " + quote_name(duplicate) + " appears twice in one object");
  if (!value.is_object()) throw file_error(path, "holds " + json_type_name(value) + ", not a JSON object");
  return value;
}

}  // namespace kvhead::io
