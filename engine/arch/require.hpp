// Argument checks at the public boundary (ruy's validate.h): the message is
// built only when the check fails, so a passing check allocates nothing.
#pragma once

#include <stdexcept>
#include <string>

namespace kvhead::engine {

/// Throws std::invalid_argument(message()) when `condition` is false.
template <class Message>
void require(bool condition, const Message& message) {
  if (!condition) [[unlikely]]
    throw std::invalid_argument(std::string(message()));
}

}  // namespace kvhead::engine
