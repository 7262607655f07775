/* kvhead's C API in one program (C99): load a layer, decode several sequences
   token by token over a KV cache, and check each output against the
   cache-free forward pass with causal = 1 (they must agree bit for bit).

   usage: capi_example WEIGHTS.safetensors NUM_HEADS NUM_KV_HEADS ROPE_THETA [PREFIX]
   Exit status 0 when every output matches; 1 with a message otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvhead/kvhead.h>

enum { num_seqs = 3 };
static const int64_t seq_lengths[num_seqs] = {5, 1, 9};

/* Prints the failed call and kvhead's message; exits 1. */
static void check(kvh_status status, const char* call) {
  if (status == KVH_OK) return;
  fprintf(stderr, "capi_example: %s failed: %s: %s\n", call, kvh_status_name(status), kvh_last_error());
  exit(1);
}

/* Deterministic inputs in [-1, 1). */
static float next_value(uint32_t* state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)(*state >> 8) / (float)(1u << 23) - 1.0f;
}

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: %s WEIGHTS.safetensors NUM_HEADS NUM_KV_HEADS ROPE_THETA [PREFIX]\n", argv[0]);
    return 2;
  }
  /* 1. The layer. */
  kvh_layer_options options;
  kvh_layer_options_init(&options);
  options.num_heads = atoi(argv[2]);
  options.num_kv_heads = atoi(argv[3]);
  options.rope_theta = (float)atof(argv[4]);
  options.prefix = argc == 6 ? argv[5] : NULL;
  kvh_layer* layer = NULL;
  check(kvh_layer_open(argv[1], &options, &layer), "kvh_layer_open");
  const int64_t d_model = kvh_layer_d_model(layer);

  /* 2. Inputs: sequence s has seq_lengths[s] tokens of d_model floats. */
  float* x[num_seqs];
  float* decoded[num_seqs];
  uint32_t state = 12345u;
  for (int s = 0; s < num_seqs; ++s) {
    const size_t floats = (size_t)(seq_lengths[s] * d_model);
    x[s] = malloc(floats * sizeof(float));
    decoded[s] = malloc(floats * sizeof(float));
    if (x[s] == NULL || decoded[s] == NULL) return 1;
    for (size_t i = 0; i < floats; ++i) x[s][i] = next_value(&state);
  }

  /* 3. Token by token: each step, one kvh_decode call gives one new token to
     every sequence that has one left; x and y hold their rows back to back. */
  kvh_cache* cache = NULL;
  check(kvh_cache_create(layer, (size_t)16 << 20, &cache), "kvh_cache_create");
  int64_t ids[num_seqs];
  for (int s = 0; s < num_seqs; ++s) check(kvh_sequence_create(cache, &ids[s]), "kvh_sequence_create");
  float* step_x = malloc((size_t)(num_seqs * d_model) * sizeof(float));
  float* step_y = malloc((size_t)(num_seqs * d_model) * sizeof(float));
  if (step_x == NULL || step_y == NULL) return 1;
  for (int64_t position = 0;; ++position) {
    int64_t step_ids[num_seqs], step_tokens[num_seqs];
    int64_t count = 0;
    for (int s = 0; s < num_seqs; ++s) {
      if (position >= seq_lengths[s]) continue;
      memcpy(step_x + count * d_model, x[s] + position * d_model, (size_t)d_model * sizeof(float));
      step_ids[count] = ids[s];
      step_tokens[count] = 1;
      ++count;
    }
    if (count == 0) break;
    check(kvh_decode(layer, cache, step_ids, step_tokens, count, step_x, step_y), "kvh_decode");
    count = 0;
    for (int s = 0; s < num_seqs; ++s) {
      if (position >= seq_lengths[s]) continue;
      memcpy(decoded[s] + position * d_model, step_y + count * d_model, (size_t)d_model * sizeof(float));
      ++count;
    }
  }

  /* 4. The same sequences without a cache, causal: identical bits. */
  int failures = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const size_t floats = (size_t)(seq_lengths[s] * d_model);
    float* expected = malloc(floats * sizeof(float));
    if (expected == NULL) return 1;
    check(kvh_layer_forward(layer, x[s], 1, seq_lengths[s], 1, expected), "kvh_layer_forward");
    if (kvh_sequence_length(cache, ids[s]) != seq_lengths[s] ||
        memcmp(expected, decoded[s], floats * sizeof(float)) != 0) {
      fprintf(stderr, "capi_example: sequence %d (%lld tokens) differs from the forward pass\n", s,
              (long long)seq_lengths[s]);
      ++failures;
    }
    free(expected);
  }
  printf("capi_example: kvhead %s, d_model %lld, %d sequences decoded token by token: %s\n", kvh_version(),
         (long long)d_model, num_seqs, failures == 0 ? "identical to the forward pass" : "MISMATCH");

  for (int s = 0; s < num_seqs; ++s) {
    check(kvh_sequence_free(cache, ids[s]), "kvh_sequence_free");
    free(x[s]);
    free(decoded[s]);
  }
  free(step_x);
  free(step_y);
  kvh_cache_destroy(cache);
  kvh_layer_close(layer);
  return failures == 0 ? 0 : 1;
}
