// A C++ program using the installed kvhead: one small layer from arrays,
// decoded token by token over a KV cache, checked against the causal forward
// pass (bit for bit), and the C API's version beside the headers'.
#include <cstdio>
#include <cstring>
#include <vector>

#include <kvhead/attention.hpp>
#include <kvhead/config.hpp>
#include <kvhead/kv_cache.hpp>
#include <kvhead/kvhead.h>

int main() {
  constexpr std::size_t heads = 2, kv_heads = 1, head_dim = 4, d_model = 8, tokens = 6;
  std::vector<float> wq(heads * head_dim * d_model), wk(kv_heads * head_dim * d_model), wv(wk.size()),
      wo(d_model * heads * head_dim), x(tokens * d_model);
  float value = 0.0f;
  for (std::vector<float>* array : {&wq, &wk, &wv, &wo, &x})
    for (float& element : *array) element = (value += 0.37f) - float(int(value)) - 0.5f;

  const kvhead::attention_layer layer(
      {heads, kv_heads, head_dim, d_model, {}, true, 10000.0},
      {{wq.data(), nullptr}, {wk.data(), nullptr}, {wv.data(), nullptr}, {wo.data(), nullptr}});
  std::vector<float> expected(x.size()), decoded(x.size());
  layer.forward(x.data(), 1, tokens, expected.data());

  kvhead::kv_cache cache({1, kv_heads, head_dim, 0, std::size_t(1) << 20});
  const kvhead::sequence_id id = cache.create();
  for (std::size_t t = 0; t < tokens; ++t) {
    cache.append(id, 1);
    layer.forward(cache, 0, {{id, 1}}, x.data() + t * d_model, decoded.data() + t * d_model);
  }
  const bool same = std::memcmp(expected.data(), decoded.data(), x.size() * sizeof(float)) == 0;
  std::printf("consumer: kvhead %s (headers %s, C API %s), SIMD path %s: decode %s the forward pass\n",
              kvhead::version(), KVHEAD_VERSION_STRING, kvh_version(), kvhead::to_string(kvhead::active_simd_path()),
              same ? "equals" : "DIFFERS FROM");
  return same && std::strcmp(kvh_version(), KVHEAD_VERSION_STRING) == 0 ? 0 : 1;
}
