#include "bench/shapes.hpp"

#include <algorithm>

namespace kvhead::bench {
namespace {

// What the memo below may hold: S5's sequences (71 M floats of K and V) fit.
constexpr std::size_t decode_kv_memo_floats = std::size_t{1} << 27;

}  // namespace

std::shared_ptr<const sequence_kv> decode_kv(const decode_shape& shape, std::size_t i) {
  // The sequences made, least recently used first; a sequence's values
  // depend only on its index (the seeds) and its size.
  struct made {
    std::size_t index, values;
    std::shared_ptr<const sequence_kv> kv;
  };
  static std::vector<made> memo;
  const std::size_t values = (shape.pasts[i] + 1) * shape.kv_heads * shape.head_dim;
  const auto found =
      std::find_if(memo.begin(), memo.end(), [&](const made& m) { return m.index == i && m.values == values; });
  std::shared_ptr<const sequence_kv> kv;
  if (found != memo.end()) {
    kv = found->kv;
    memo.erase(found);
  } else {
    kv = std::make_shared<const sequence_kv>(
        sequence_kv{random_floats(values, unsigned(i + 1)), random_floats(values, unsigned(i + 1001))});
  }
  memo.push_back({i, values, kv});
  // Forget the least recently used beyond the budget (the newest always stays).
  std::size_t held = 0, keep = memo.size();
  while (keep > 0 && (held += 2 * memo[keep - 1].values) <= decode_kv_memo_floats) --keep;
  memo.erase(memo.begin(), memo.begin() + std::ptrdiff_t(std::min(keep, memo.size() - 1)));
  return kv;
}

}  // namespace kvhead::bench
