// Argument checks at the public boundary (ruy's validate.h): the message is
// built only when the check fails, so a passing check allocates nothing.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

namespace kvhead::engine {

/// Throws std::invalid_argument(message()) when `condition` is false.
template <class Message>
void require(bool condition, const Message& message) {
  if (!condition) [[unlikely]]
    throw std::invalid_argument(std::string(message()));
}

/// A real number for a message, to 9 significant digits (std::to_string
/// would print 1e-30 as 0.000000).
inline std::string real_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

}  // namespace kvhead::engine
