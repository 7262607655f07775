#include "engine/attention/rope.hpp"

#include "engine/attention/rope_scaling.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace kvhead::engine {

namespace {

// cos and sin of positions [0, positions) for one set of frequencies over
// rotary_dim r: position p's cos[0, r/2) then sin[0, r/2) at cos_sin + p * r.
// Immutable once published.
struct rope_table {
  std::size_t positions = 0;
  std::vector<float> cos_sin;
};

// The most positions a table holds: 2^17 (64 MiB at rotary_dim 128). Rows at
// later positions compute their cos and sin on the spot, with the same
// arithmetic (rope_table_source::angles), so a position's bits never depend
// on whether the table covered it, and a call whose rows are all that far
// grows no table.
constexpr std::size_t table_limit = std::size_t{1} << 17;

// Positions a table grows to when `positions` (<= table_limit) are needed: at
// least 4096 (a context most callers stay within) and the power of two at or
// above twice the request, so one growth covers a long stretch of decoding.
std::size_t grown_positions(std::size_t positions) {
  constexpr std::size_t minimum = 4096;
  static_assert(minimum <= table_limit && std::has_single_bit(table_limit));
  return std::min(table_limit, std::max(minimum, std::bit_ceil(2 * positions)));
}

}  // namespace

// The table of one set of frequencies. Readers copy the current snapshot under
// the mutex (a reference count, no allocation) and use it unlocked; a reader
// that needs more positions builds a larger table outside the lock — the build
// runs in parallel, and a thread waiting there may steal a task that asks for
// this very table — then publishes it. Snapshots of older tables stay valid
// while anyone holds them.
class rope_table_source {
 public:
  explicit rope_table_source(const rope_frequencies& frequencies)
      : rotary_dim_(2 * frequencies.inv_freq.size()),
        inv_freq_(frequencies.inv_freq),
        attention_factor_(frequencies.attention_factor) {}

  /// cos and sin of pairs [first, first + count) of position `position`,
  /// into cos[0, count) and sin[0, count): angle = position * inv_freq_i in
  /// double, cos and sin times the attention factor, rounded to float.
  void angles(std::size_t position, std::size_t first, std::size_t count, float* cos, float* sin) const {
    for (std::size_t i = 0; i < count; ++i) {
      const double angle = double(position) * inv_freq_[first + i];
      cos[i] = float(std::cos(angle) * attention_factor_);
      sin[i] = float(std::sin(angle) * attention_factor_);
    }
  }

  /// A table of at least min(positions, table_limit) positions.
  std::shared_ptr<const rope_table> covering(std::size_t positions) {
    positions = std::min(positions, table_limit);
    std::shared_ptr<const rope_table> current;
    {
      const std::lock_guard lock(mutex_);
      current = current_;
    }
    if (current != nullptr && current->positions >= positions) return current;
    std::shared_ptr<const rope_table> grown = grow(current.get(), grown_positions(positions));
    const std::lock_guard lock(mutex_);
    if (current_ == nullptr || current_->positions < grown->positions) current_ = std::move(grown);
    return current_;
  }

 private:
  // `old`'s rows copied, the rest computed by angles().
  std::shared_ptr<const rope_table> grow(const rope_table* old, std::size_t positions) const {
    auto table = std::make_shared<rope_table>();
    table->positions = positions;
    table->cos_sin.resize(positions * rotary_dim_);
    const std::size_t kept = old != nullptr ? old->positions : 0;
    if (old != nullptr) std::copy(old->cos_sin.begin(), old->cos_sin.end(), table->cos_sin.begin());
    tbb::parallel_for(tbb::blocked_range<std::size_t>(kept, positions, 256),
                      [&](const tbb::blocked_range<std::size_t>& range) {
                        for (std::size_t position = range.begin(); position != range.end(); ++position) {
                          float* cos = table->cos_sin.data() + position * rotary_dim_;
                          angles(position, 0, inv_freq_.size(), cos, cos + inv_freq_.size());
                        }
                      });
    return table;
  }

  std::size_t rotary_dim_;
  std::vector<double> inv_freq_;  // [rotary_dim / 2]
  double attention_factor_;
  std::mutex mutex_;
  std::shared_ptr<const rope_table> current_;  // null until first asked
};

namespace {

// The process-wide registry: one table source per (inverse frequencies,
// attention factor), shared by the ropes (layers) that use it and freed with
// the last of them (up to 64 MiB each at rotary_dim 128: a process loading
// layers of many thetas keeps only the live ones'). Equal frequencies give
// equal tables, whatever theta and scaling produced them. Entries of freed
// sources are dropped as new ones come.
std::shared_ptr<rope_table_source> shared_table(const rope_frequencies& frequencies) {
  static std::mutex mutex;
  static std::map<std::pair<std::vector<double>, double>, std::weak_ptr<rope_table_source>> sources;
  const std::lock_guard lock(mutex);
  std::erase_if(sources, [](const auto& entry) { return entry.second.expired(); });
  std::weak_ptr<rope_table_source>& entry = sources[{frequencies.inv_freq, frequencies.attention_factor}];
  std::shared_ptr<rope_table_source> source = entry.lock();
  if (source == nullptr) {
    source = std::make_shared<rope_table_source>(frequencies);
    entry = source;
  }
  return source;
}

}  // namespace

rope::rope(std::size_t head_dim, double theta) : rope(head_dim, head_dim, theta, rope_scaling{}) {}

rope::rope(std::size_t head_dim, std::size_t rotary_dim, double theta, const rope_scaling& scaling)
    : head_dim_(head_dim),
      rotary_dim_(rotary_dim),
      table_(theta == 0.0 ? nullptr
                          : shared_table(scaled_rope_frequencies(
                                theta, rotary_dim, scaling,
                                scaling.longrope_factors == rope_scaling::longrope_pick::long_factors))),
      long_table_(theta == 0.0 || scaling.type != rope_scaling::kind::longrope ||
                          scaling.longrope_factors != rope_scaling::longrope_pick::per_call
                      ? nullptr
                      : shared_table(scaled_rope_frequencies(theta, rotary_dim, scaling, true))),
      long_length_(long_table_ != nullptr ? longrope_long_length(scaling) : SIZE_MAX) {}

void rope::apply(float* x, std::size_t rows, std::size_t row_stride, std::size_t heads, const std::size_t* positions,
                 const std::size_t* lengths) const {
  if (table_ == nullptr || rows == 0) return;
  // Whether a row takes the long table: its sequence at long_length_ tokens
  // or more (a position of SIZE_MAX is a length past every size).
  auto long_row = [&](std::size_t row) {
    return long_table_ != nullptr &&
           (lengths != nullptr ? lengths[row] : std::max(positions[row], positions[row] + 1)) >= long_length_;
  };
  // Positions each table must hold: its rows' within table_limit.
  std::size_t covered = 0, long_covered = 0;
  for (std::size_t row = 0; row < rows; ++row)
    if (positions[row] < table_limit) {
      std::size_t& needed = long_row(row) ? long_covered : covered;
      needed = std::max(needed, positions[row] + 1);
    }
  const std::shared_ptr<const rope_table> table = covered > 0 ? table_->covering(covered) : nullptr;
  const std::shared_ptr<const rope_table> long_table = long_covered > 0 ? long_table_->covering(long_covered) : nullptr;
  const std::size_t half = rotary_dim_ / 2;
  // Pairs [first, first + count) of every head of `row`, with their cos and sin.
  auto rotate_pairs = [&](std::size_t row, std::size_t first, std::size_t count, const float* cos, const float* sin) {
    for (std::size_t head = 0; head < heads; ++head) {
      float* values = x + row * row_stride + head * head_dim_ + first;
      for (std::size_t i = 0; i < count; ++i) {
        const float first_half = values[i], second_half = values[i + half];
        values[i] = first_half * cos[i] - second_half * sin[i];
        values[i + half] = second_half * cos[i] + first_half * sin[i];
      }
    }
  };
  auto rotate = [&](std::size_t row_begin, std::size_t row_end) {
    for (std::size_t row = row_begin; row < row_end; ++row) {
      const bool long_factors = long_row(row);
      const rope_table* const row_table = long_factors ? long_table.get() : table.get();
      if (row_table != nullptr && positions[row] < row_table->positions) {
        const float* cos = row_table->cos_sin.data() + positions[row] * rotary_dim_;
        rotate_pairs(row, 0, half, cos, cos + half);
        continue;
      }
      // Past the table: the same cos and sin, computed a few pairs at a time.
      constexpr std::size_t pairs_at_once = 32;
      float cos[pairs_at_once], sin[pairs_at_once];
      for (std::size_t first = 0; first < half; first += pairs_at_once) {
        const std::size_t count = std::min(pairs_at_once, half - first);
        (long_factors ? long_table_ : table_)->angles(positions[row], first, count, cos, sin);
        rotate_pairs(row, first, count, cos, sin);
      }
    }
  };
  // ~32K floats (a few microseconds) per task: a decode step's few rows stay
  // on the calling thread.
  const std::size_t rows_per_task = std::max<std::size_t>(1, 32768 / (heads * head_dim_));
  if (rows <= rows_per_task) {
    rotate(0, rows);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, rows, rows_per_task),
                    [&](const tbb::blocked_range<std::size_t>& range) { rotate(range.begin(), range.end()); });
}

}  // namespace kvhead::engine
