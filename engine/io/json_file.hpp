// A small JSON file (config.json, model.safetensors.index.json) read whole
// and parsed strictly: valid UTF-8 JSON, an object at the top, and no key
// twice in any object (nlohmann would keep the last one silently). Every
// problem is a file_error naming the file; files over 64 MiB are refused
// (real configs and shard indexes are kilobytes to a few megabytes).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace kvhead::io {

nlohmann::json read_json_object(const std::string& path);

/// JSON's name for the type of `value` ("a string", "an array", ...), for messages.
std::string json_type_name(const nlohmann::json& value);

/// `value` for a message, short whatever the file holds: a number, true,
/// false or null as written, a string quoted (quote_name), an array or an
/// object by its type's name alone (never serialized: a hostile value nested
/// 100000 deep would overflow the stack of the recursive dump()).
std::string json_value_text(const nlohmann::json& value);

}  // namespace kvhead::io
