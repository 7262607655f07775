/* kvhead.h: kvhead's C API (C99), for servers written in any language (C,
   Rust, Go, Python through ctypes or cffi). It wraps the C++ API
   (attention.hpp, kv_cache.hpp): one attention layer read from a safetensors
   file, and a paged KV cache for token-by-token decoding.

   Link: find_package(kvhead CONFIG) and target kvhead::kvhead (shared) or
   kvhead::kvhead_static, or `pkg-config --cflags --libs kvhead`.

   Typical use (error handling shortened):

     kvh_layer_options options;
     kvh_layer_options_init(&options);            // every field at its default
     options.num_heads = 32;
     options.num_kv_heads = 8;
     options.rope_theta = 10000.0f;
     options.prefix = "model.layers.0.self_attn.";
     kvh_layer* layer;
     if (kvh_layer_open("model.safetensors", &options, &layer) != KVH_OK)
       fprintf(stderr, "%s\n", kvh_last_error());
     kvh_cache* cache;
     kvh_cache_create(layer, (size_t)1 << 30, &cache);   // 1 GiB of K and V
     int64_t id;
     kvh_sequence_create(cache, &id);
     int64_t n = prompt_tokens;
     kvh_decode(layer, cache, &id, &n, 1, prompt_x, prompt_y);   // prefill
     n = 1;
     kvh_decode(layer, cache, &id, &n, 1, next_x, next_y);        // one step
     kvh_sequence_free(cache, id);
     kvh_cache_destroy(cache);
     kvh_layer_close(layer);

   Errors. Every function validates its arguments and reports through its
   return value; none aborts, throws or prints. On failure it returns a
   status other than KVH_OK, writes nothing through its output pointers,
   leaves the cache as it was (see kvh_decode for the one nuance), and
   kvh_last_error() then names the function and the problem. Statuses:
     KVH_ERR_INVALID_ARGUMENT  a NULL pointer, a count or size < 1, an id
                               listed twice in one call, a truncate beyond
                               the length, options out of range, x and y
                               overlapping, a layer whose geometry does not
                               match the cache;
     KVH_ERR_IO                a file that is missing, unreadable or not a
                               regular file;
     KVH_ERR_FORMAT            a malformed file, or one whose tensors do not
                               fit the options (a prefix matching no tensor,
                               a num_kv_heads the weights disagree with, ...);
     KVH_ERR_CAPACITY          no room: the cache's pool is full for this
                               call, or host memory ran out, or a worker
                               thread could not be started;
     KVH_ERR_NOT_FOUND         an unknown or freed sequence id (ids are
                               never reused, so a freed id stays unknown);
     KVH_ERR_INTERNAL          anything else (a bug: please report it), e.g.
                               KVHEAD_ISA asking for a SIMD path this CPU
                               cannot run.

   Lifetimes. A kvh_layer owns copies of its weights (the file is closed when
   kvh_layer_open returns). A kvh_cache is tied to a geometry (number of
   layers, num_kv_heads, head_dim), not to the layer object it was created
   from: it may outlive that layer and serve any layer of the same
   num_kv_heads and head_dim. Pointers passed in (x, y, ids, paths, options)
   are used only during the call. Close or destroy an object only when no
   other call on it is running.

   Threads. Calls on distinct sequences of one cache may run concurrently
   from any threads, with the same or different layers (a layer is never
   modified by a call). Calls naming the same sequence must not overlap when
   one of them modifies it (decode, append, truncate, free). Each layer does
   its work in a oneTBB arena of kvh_layer_options.threads threads (0: the
   caller's arena, all cores by default). Results are bit-identical for any
   thread count, chunking of the tokens and batching of the sequences.

   Arrays are row-major float32. x and y never overlap. */
#ifndef KVHEAD_KVHEAD_H
#define KVHEAD_KVHEAD_H

#include <stddef.h>
#include <stdint.h>

#include "kvhead/export.h"
#include "kvhead/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvh_status {
  KVH_OK = 0,
  KVH_ERR_INVALID_ARGUMENT,
  KVH_ERR_IO,
  KVH_ERR_FORMAT,
  KVH_ERR_CAPACITY,
  KVH_ERR_NOT_FOUND,
  KVH_ERR_INTERNAL
} kvh_status;

/* One attention layer (projections, RoPE, attention, output projection). */
typedef struct kvh_layer kvh_layer;
/* A paged KV cache: sequences of one id space, for one or more layers. */
typedef struct kvh_cache kvh_cache;

/* How kvh_layer_open reads a layer. Tensors, in PyTorch nn.Linear layout:
   <prefix>q_proj.weight [H*d, d_model], <prefix>k_proj.weight and
   <prefix>v_proj.weight [G*d, d_model], <prefix>o_proj.weight [d_model, H*d],
   each with an optional .bias; F32, F16 or BF16. head_dim d = rows of q_proj
   / num_heads.

   ABI rule: this struct only grows, and only at its end. Always start from
   kvh_layer_options_init, which fills every field with its default and sets
   struct_size to the size this program was compiled with (the macro below),
   so a program built against an older header keeps working with a newer
   library (the fields it does not know take their defaults), and a newer
   program with an older library is told so (KVH_ERR_INVALID_ARGUMENT). */
/* How a cache stores K and V (kvhead::kv_dtype, kv_cache.hpp): f32; bf16 or
   f16 (round to nearest even, NaN and Inf kept); int8 (symmetric, one fp32
   scale per token and kv head for K and for V; a non-finite row makes every
   output attending to it NaN). Attention reads them in place, never through
   a dequantized copy; its products run in fp32, or on the CPU's bf16 or
   integer dot products where it has them (kv_cache.hpp says which). */
typedef enum kvh_kv_dtype { KVH_KV_F32 = 0, KVH_KV_BF16, KVH_KV_F16, KVH_KV_INT8 } kvh_kv_dtype;

/* How a layer computes (kvhead::precision, attention.hpp's
   attention_config::precision): f32 throughout, or bf16 weights (a BF16
   file's as they are, others rounded to nearest even at open) with each
   projection's input, q, k, v and the attention probabilities rounded to
   bf16, fp32 accumulation and outputs (max |y - y_f32| / max |y_f32| about
   3.1e-3 on a Llama-sized layer). Results stay bit-identical for any thread
   count, chunking and batching. */
typedef enum kvh_precision { KVH_PRECISION_F32 = 0, KVH_PRECISION_BF16 } kvh_precision;

typedef struct kvh_layer_options {
  size_t struct_size;               /* sizeof(kvh_layer_options); set by kvh_layer_options_init */
  int32_t num_heads, num_kv_heads;  /* num_kv_heads 0 = num_heads */
  float rope_theta;                 /* 0 = no RoPE */
  float scale;                      /* 0 = 1/sqrt(head_dim) */
  const char* prefix;               /* tensor-name prefix, NULL = none */
  int32_t threads;                  /* 0 = all cores */
  int32_t kv_dtype;                 /* a kvh_kv_dtype: how caches created from this layer store K/V; 0 = f32 */
  float logit_softcap;              /* Gemma 2 logit soft-capping: each scaled score s becomes
                                       cap * tanh(s / cap) before the causal mask; 0 = none, else
                                       finite and > 0 */
  const float* sinks;               /* gpt-oss attention sinks: num_heads finite logits (head h's at
                                       sinks[h]) that join each row's softmax denominator and carry no
                                       value; copied by kvh_layer_open; NULL = none */
  int32_t precision;                /* a kvh_precision: how the layer computes; 0 = f32 */
  int64_t sliding_window;           /* sliding-window attention (Mistral, Qwen 2, Gemma 2, gpt-oss): key
                                       j visible to query i only if i - j < sliding_window; 0 = none,
                                       else > 0 */
  int32_t kv_block_size;            /* tokens per block of the caches created from this layer: 16, 32,
                                       64, 128 or 256; 0 = 256. Every size gives the same results;
                                       a smaller one pins less memory per short sequence */
  const float* alibi_slopes;        /* ALiBi (BLOOM, MPT, Falcon-RW, Baichuan 13B): num_heads finite slopes
                                       (head h's at alibi_slopes[h]); each score of query position i and
                                       key j gets slope * (j - i) (attention.hpp, "Variants"); copied
                                       by kvh_layer_open; NULL = none */
  /* Later versions add fields here, each documented with its default. */
} kvh_layer_options;

/* The defaults: num_heads 0 (must be set), num_kv_heads 0, rope_theta 0,
   scale 0, prefix NULL, threads 0, kv_dtype KVH_KV_F32, logit_softcap 0,
   sinks NULL, precision KVH_PRECISION_F32, sliding_window 0, kv_block_size 0,
   alibi_slopes NULL;
   struct_size = the library's sizeof(kvh_layer_options). Through the macro
   below, C and C++ programs call kvh_layer_options_init_sized with their own
   sizeof. A NULL options is ignored. */
KVHEAD_API void kvh_layer_options_init(kvh_layer_options* options);
/* Sets every field lying within the first struct_size bytes to its default
   and options->struct_size to struct_size; a struct_size below the first
   version's (the struct above) changes nothing. */
KVHEAD_API void kvh_layer_options_init_sized(kvh_layer_options* options, size_t struct_size);
#define kvh_layer_options_init(options) kvh_layer_options_init_sized((options), sizeof(kvh_layer_options))

/* Reads and checks one layer; *out receives it (close it with
   kvh_layer_close). num_heads must be >= 1, num_kv_heads >= 0 and dividing
   num_heads, rope_theta finite and >= 0 (> 0 needs an even head_dim), scale
   finite, threads 0 to 4096 (more than this machine's CPUs: capped there),
   logit_softcap finite and >= 0, every sink finite, sliding_window >= 0,
   kv_block_size 0 or one of 16, 32, 64, 128, 256. */
KVHEAD_API kvh_status kvh_layer_open(const char* safetensors_path, const kvh_layer_options* options, kvh_layer** out);
/* Layer layer_index of a Hugging Face model folder: config.json, and
   model.safetensors or model.safetensors.index.json with its shards (the
   families and variants kvhead/model.hpp lists; what kvhead does not
   implement is an error naming the field). Everything comes from
   config.json: options->num_heads, num_kv_heads, rope_theta, scale,
   logit_softcap and sliding_window (this layer's window: 0 for a full
   layer) must each be 0 or agree with it, prefix and sinks must be
   NULL (sinks come from the folder's self_attn.sinks); threads as for
   kvh_layer_open. The layer is causal (kvh_layer_forward's causal flag still
   chooses per call). Statuses: folder not a folder, without config.json,
   or a file it names missing, unreadable or not a regular file (a shard, a
   broken link): KVH_ERR_IO; layer_index < 0 or >= num_hidden_layers, or
   options that contradict config.json: KVH_ERR_INVALID_ARGUMENT; anything
   else wrong or unsupported in the files' contents: KVH_ERR_FORMAT. */
KVHEAD_API kvh_status kvh_layer_open_model(const char* folder, int32_t layer_index, const kvh_layer_options* options,
                                           kvh_layer** out);
/* The layer's width d_model (0 for a NULL layer). */
KVHEAD_API int32_t kvh_layer_d_model(const kvh_layer* layer);
/* Its num_heads, num_kv_heads and head_dim (0 for a NULL layer). */
KVHEAD_API int32_t kvh_layer_num_heads(const kvh_layer* layer);
KVHEAD_API int32_t kvh_layer_num_kv_heads(const kvh_layer* layer);
KVHEAD_API int32_t kvh_layer_head_dim(const kvh_layer* layer);
/* y = layer(x) without a cache: x, y [batch, seq, d_model]; every sequence
   starts at position 0; causal != 0 masks future positions. batch, seq >= 1. */
KVHEAD_API kvh_status kvh_layer_forward(const kvh_layer* layer, const float* x, int64_t batch, int64_t seq,
                                        int causal, float* y); /* x, y: [batch, seq, d_model] */
/* Frees the layer; NULL is ignored. */
KVHEAD_API void kvh_layer_close(kvh_layer* layer);

/* A one-layer cache for layers of this layer's num_kv_heads and head_dim,
   storing K/V as the layer's options->kv_dtype (any layer of the geometry
   may then use it), with a pool of floor(byte_budget / block bytes) blocks of
   the layer's options->kv_block_size tokens (256 by default) allocated now
   (a budget below one block: KVH_ERR_INVALID_ARGUMENT; host memory
   exhausted: KVH_ERR_CAPACITY). */
KVHEAD_API kvh_status kvh_cache_create(const kvh_layer* layer, size_t byte_budget, kvh_cache** out);
/* A cache for num_layers >= 1 layers of this geometry sharing one id space:
   a token reserved by kvh_sequence_append has room in every layer at once
   (one block holds all layers). Decode it with kvh_decode_layer. */
KVHEAD_API kvh_status kvh_cache_create_layers(const kvh_layer* layer, int32_t num_layers, size_t byte_budget,
                                              kvh_cache** out);
/* Its number of layers (0 for a NULL cache). */
KVHEAD_API int32_t kvh_cache_num_layers(const kvh_cache* cache);
/* Tokens that fit in its free blocks (-1 for a NULL cache). A sequence whose
   last block is partly filled also has room there. */
KVHEAD_API int64_t kvh_cache_free_tokens(const kvh_cache* cache);
/* Frees the cache and every sequence in it; NULL is ignored. */
KVHEAD_API void kvh_cache_destroy(kvh_cache* cache);

/* A new empty sequence; ids start at 1 and are never reused by a cache. */
KVHEAD_API kvh_status kvh_sequence_create(kvh_cache* cache, int64_t* seq_id);
/* A new sequence sharing the parent's tokens (no copy, no block: blocks are
   shared and copied on write). */
KVHEAD_API kvh_status kvh_sequence_fork(kvh_cache* cache, int64_t parent, int64_t* child);
/* Shortens the sequence to 0 <= length <= its length (rollback). */
KVHEAD_API kvh_status kvh_sequence_truncate(kvh_cache* cache, int64_t seq_id, int64_t length);
/* Its length in tokens; -1 if the cache is NULL or the id unknown or freed
   (kvh_last_error then says which). */
KVHEAD_API int64_t kvh_sequence_length(const kvh_cache* cache, int64_t seq_id); /* -1 if unknown */
/* Drops the sequence; its id is not reused. */
KVHEAD_API kvh_status kvh_sequence_free(kvh_cache* cache, int64_t seq_id);
/* For a model whose every layer slides with a window of `window` >= 1 keys:
   returns to the pool the sequence's leading blocks that no query still to
   come can see (kvhead::kv_cache::drop_outside_window, kv_cache.hpp's
   "Sliding windows"); *dropped_tokens (may be NULL) receives how many
   leading positions are dropped in all. The sequence keeps its length. A
   later decode whose queries would see a dropped position (a layer without
   that window) fails with KVH_ERR_INVALID_ARGUMENT, and a truncate below the
   dropped positions with KVH_ERR_INVALID_ARGUMENT, each leaving the cache
   as it was. */
KVHEAD_API kvh_status kvh_sequence_drop_outside_window(kvh_cache* cache, int64_t seq_id, int64_t window,
                                                       int64_t* dropped_tokens);

/* Appends num_tokens[i] new tokens to sequence seq_ids[i] for each i, attends causally over each whole past.
   x and y hold the tokens of all sequences back to back: [sum(num_tokens), d_model].
   The cache must have one layer (kvh_cache_create); the layer's num_kv_heads
   and head_dim must match it. num_seqs >= 1, every num_tokens[i] >= 1, no id
   twice. Each sequence's new tokens sit at its positions length, length + 1,
   ... (RoPE uses those absolute positions). y equals kvh_layer_forward with
   causal = 1 over each whole sequence, bit for bit.
   On failure no sequence grows. When the pool filled up, or host memory ran
   out, part way, the sequences already extended are truncated back; if one
   of them had to copy a block shared with a fork first, it keeps that
   private copy (same tokens, one block fewer free). */
KVHEAD_API kvh_status kvh_decode(const kvh_layer* layer, kvh_cache* cache, const int64_t* seq_ids,
                                 const int64_t* num_tokens, int64_t num_seqs, const float* x, float* y);

/* Multi-layer decoding, in two steps per batch of new tokens:
   1. kvh_sequence_append reserves num_tokens[i] new positions of sequence
      seq_ids[i] in every layer of the cache at once (the checks, the
      capacity and the failure rule of kvh_decode);
   2. kvh_decode_layer, once per layer (0 <= layer_index < num_layers, in
      the model's order, y of one layer feeding x of the next), computes that
      layer for the newest num_tokens[i] positions of each sequence
      (1 <= num_tokens[i] <= its length), writing their K and V into the
      cache's layer layer_index.
   kvh_decode is append + kvh_decode_layer(layer_index 0) on a one-layer cache. */
KVHEAD_API kvh_status kvh_sequence_append(kvh_cache* cache, const int64_t* seq_ids, const int64_t* num_tokens,
                                          int64_t num_seqs);
KVHEAD_API kvh_status kvh_decode_layer(const kvh_layer* layer, kvh_cache* cache, int32_t layer_index,
                                       const int64_t* seq_ids, const int64_t* num_tokens, int64_t num_seqs,
                                       const float* x, float* y);

/* The message of this thread's most recent failed call, naming the function
   and the problem ("" before any failure). Successful calls leave it alone.
   Valid until this thread's next failed call. */
KVHEAD_API const char* kvh_last_error(void); /* message of this thread's last failed call */
/* "KVH_OK", "KVH_ERR_IO", ...; "unknown status" for any other value. */
KVHEAD_API const char* kvh_status_name(kvh_status status);
/* The library's version, "major.minor.patch" (KVHEAD_VERSION_STRING is the
   headers'). */
KVHEAD_API const char* kvh_version(void);

#ifdef __cplusplus
}
#endif

#endif
