"""kvhead's C API (include/kvhead/kvhead.h) for Python, through ctypes and numpy.

No build step: this file loads the installed shared library (libkvhead.so.0,
or a path given to Library / in KVHEAD_LIBRARY) and wraps it for float32
numpy arrays. Every failed call raises KvheadError with the C status and
kvh_last_error()'s message.

    import numpy as np
    from kvhead_ctypes import Library

    kvhead = Library()                                  # or Library("build/release/engine/libkvhead.so")
    with kvhead.layer("model.safetensors", num_heads=32, num_kv_heads=8, rope_theta=10000.0,
                      prefix="model.layers.0.self_attn.") as layer, \\
         kvhead.cache(layer, byte_budget=1 << 30) as cache:
        seq = cache.create()
        y = cache.decode(layer, [seq], [len(prompt)], prompt)     # prompt: [tokens, d_model]
        y = cache.decode(layer, [seq], [1], next_token)           # one decode step
        full = layer.forward(prompt[None], causal=True)           # [batch, seq, d_model]

Arrays are converted to C-contiguous float32 when they are not already. The
threading rules are the C API's: calls on distinct sequences may run from
several Python threads (ctypes releases the GIL during each call).
"""

import ctypes
import os

import numpy as np

_STATUS_NAMES = ("KVH_OK", "KVH_ERR_INVALID_ARGUMENT", "KVH_ERR_IO", "KVH_ERR_FORMAT", "KVH_ERR_CAPACITY",
                 "KVH_ERR_NOT_FOUND", "KVH_ERR_INTERNAL")
OK, INVALID_ARGUMENT, IO, FORMAT, CAPACITY, NOT_FOUND, INTERNAL = range(len(_STATUS_NAMES))

_float_p = ctypes.POINTER(ctypes.c_float)
_int64_p = ctypes.POINTER(ctypes.c_int64)


class KvheadError(RuntimeError):
    """A failed kvhead call: .status (an int, e.g. kvhead_ctypes.IO), .status_name, and the message."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = _STATUS_NAMES[status] if 0 <= status < len(_STATUS_NAMES) else str(status)
        super().__init__(f"{self.status_name}: {message}")


class _LayerOptions(ctypes.Structure):
    # kvh_layer_options, field for field; later versions add fields at the end.
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_heads", ctypes.c_int32), ("num_kv_heads", ctypes.c_int32),
                ("rope_theta", ctypes.c_float), ("scale", ctypes.c_float), ("prefix", ctypes.c_char_p),
                ("threads", ctypes.c_int32), ("kv_dtype", ctypes.c_int32), ("logit_softcap", ctypes.c_float),
                ("sinks", ctypes.POINTER(ctypes.c_float)),
                ("precision", ctypes.c_int32), ("sliding_window", ctypes.c_int64),
                ("kv_block_size", ctypes.c_int32)]


# kvh_kv_dtype: how a cache made from a layer stores K and V.
KV_DTYPES = {"f32": 0, "bf16": 1, "f16": 2, "int8": 3}
# kvh_precision: how a layer computes (bf16: weights and GEMM inputs rounded to bf16, fp32 accumulation).
PRECISIONS = {"f32": 0, "bf16": 1}


class Library:
    """The loaded shared library: path, else $KVHEAD_LIBRARY, else libkvhead.so.0 from the loader's path."""

    def __init__(self, path=None):
        self._c = ctypes.CDLL(path or os.environ.get("KVHEAD_LIBRARY") or "libkvhead.so.0")
        self._declare()

    def _declare(self):
        c, status = self._c, ctypes.c_int
        p = ctypes.c_void_p
        prototypes = {
            "kvh_layer_options_init_sized": (None, [ctypes.POINTER(_LayerOptions), ctypes.c_size_t]),
            "kvh_layer_open": (status, [ctypes.c_char_p, ctypes.POINTER(_LayerOptions), ctypes.POINTER(p)]),
            "kvh_layer_d_model": (ctypes.c_int32, [p]),
            "kvh_layer_num_heads": (ctypes.c_int32, [p]),
            "kvh_layer_num_kv_heads": (ctypes.c_int32, [p]),
            "kvh_layer_head_dim": (ctypes.c_int32, [p]),
            "kvh_layer_forward": (status, [p, _float_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, _float_p]),
            "kvh_layer_close": (None, [p]),
            "kvh_cache_create_layers": (status, [p, ctypes.c_int32, ctypes.c_size_t, ctypes.POINTER(p)]),
            "kvh_cache_num_layers": (ctypes.c_int32, [p]),
            "kvh_cache_free_tokens": (ctypes.c_int64, [p]),
            "kvh_cache_destroy": (None, [p]),
            "kvh_sequence_create": (status, [p, _int64_p]),
            "kvh_sequence_fork": (status, [p, ctypes.c_int64, _int64_p]),
            "kvh_sequence_truncate": (status, [p, ctypes.c_int64, ctypes.c_int64]),
            "kvh_sequence_drop_outside_window": (status, [p, ctypes.c_int64, ctypes.c_int64, _int64_p]),
            "kvh_sequence_length": (ctypes.c_int64, [p, ctypes.c_int64]),
            "kvh_sequence_free": (status, [p, ctypes.c_int64]),
            "kvh_sequence_append": (status, [p, _int64_p, _int64_p, ctypes.c_int64]),
            "kvh_decode": (status, [p, p, _int64_p, _int64_p, ctypes.c_int64, _float_p, _float_p]),
            "kvh_decode_layer": (status, [p, p, ctypes.c_int32, _int64_p, _int64_p, ctypes.c_int64, _float_p,
                                          _float_p]),
            "kvh_last_error": (ctypes.c_char_p, []),
            "kvh_version": (ctypes.c_char_p, []),
        }
        for name, (result, arguments) in prototypes.items():
            function = getattr(c, name)
            function.restype, function.argtypes = result, arguments

    def version(self):
        """The library's version, "major.minor.patch"."""
        return self._c.kvh_version().decode()

    def check(self, status):
        """Raises KvheadError for a status other than OK."""
        if status != OK:
            raise KvheadError(status, self._c.kvh_last_error().decode(errors="replace"))

    def layer(self, path, num_heads, num_kv_heads=0, rope_theta=0.0, scale=0.0, prefix=None, threads=0,
              kv_dtype="f32", precision="f32", sliding_window=0, kv_block_size=0):
        """Layer.open with these options (kvh_layer_options: 0 means the default; kv_dtype a key of KV_DTYPES,
        precision a key of PRECISIONS, kv_block_size 16, 32, 64, 128 or 256 tokens per block of its caches)."""
        return Layer(self, path, num_heads, num_kv_heads, rope_theta, scale, prefix, threads, kv_dtype, precision,
                     sliding_window, kv_block_size)

    def cache(self, layer, byte_budget, num_layers=1):
        """A Cache for num_layers layers of the layer's geometry."""
        return Cache(self, layer, byte_budget, num_layers)


def _floats(array):
    """array as C-contiguous float32 and a pointer to it (keep the array alive while the pointer is used)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    return array, array.ctypes.data_as(_float_p)


def _int64s(values):
    array = np.ascontiguousarray(values, dtype=np.int64)
    return array, array.ctypes.data_as(_int64_p)


class Layer:
    """One attention layer read from safetensors (kvh_layer). Close it, or use it in a with block."""

    def __init__(self, library, path, num_heads, num_kv_heads=0, rope_theta=0.0, scale=0.0, prefix=None, threads=0,
                 kv_dtype="f32", precision="f32", sliding_window=0, kv_block_size=0):
        self._lib, c, self._handle = library, library._c, None
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPES)}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
        options = _LayerOptions()
        c.kvh_layer_options_init_sized(ctypes.byref(options), ctypes.sizeof(options))
        options.num_heads, options.num_kv_heads, options.threads = num_heads, num_kv_heads, threads
        options.kv_dtype, options.precision = KV_DTYPES[kv_dtype], PRECISIONS[precision]
        options.rope_theta, options.scale, options.sliding_window = rope_theta, scale, sliding_window
        options.kv_block_size = kv_block_size
        options.prefix = prefix.encode() if prefix is not None else None
        handle = ctypes.c_void_p()
        library.check(c.kvh_layer_open(os.fsencode(path), ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle
        self.d_model = c.kvh_layer_d_model(handle)
        self.num_heads, self.num_kv_heads = c.kvh_layer_num_heads(handle), c.kvh_layer_num_kv_heads(handle)
        self.head_dim = c.kvh_layer_head_dim(handle)

    def forward(self, x, causal=False):
        """y = layer(x) without a cache: x [batch, seq, d_model] (or [seq, d_model]), y of x's shape."""
        x, x_p = _floats(x)
        if x.ndim not in (2, 3) or x.shape[-1] != self.d_model:
            raise ValueError(f"x has shape {x.shape}; expected [batch, seq, {self.d_model}] or [seq, {self.d_model}]")
        batch, seq = (1, x.shape[0]) if x.ndim == 2 else x.shape[:2]
        y = np.empty_like(x)
        self._lib.check(self._lib._c.kvh_layer_forward(self._handle, x_p, batch, seq, int(bool(causal)),
                                                       y.ctypes.data_as(_float_p)))
        return y

    def close(self):
        if self._handle:
            self._lib._c.kvh_layer_close(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.close()

    def __del__(self):
        self.close()


class Cache:
    """A paged KV cache (kvh_cache) of num_layers layers sharing one id space. Destroy it, or use a with block.

    A cache is tied to a geometry, not to a layer object: it may outlive the layer it was made from."""

    def __init__(self, library, layer, byte_budget, num_layers=1):
        self._lib, self._handle = library, None
        handle = ctypes.c_void_p()
        library.check(library._c.kvh_cache_create_layers(layer._handle, num_layers, byte_budget,
                                                         ctypes.byref(handle)))
        self._handle = handle
        self.num_layers = num_layers

    @property
    def free_tokens(self):
        return self._lib._c.kvh_cache_free_tokens(self._handle)

    def create(self):
        """A new empty sequence's id (ids are never reused)."""
        seq_id = ctypes.c_int64()
        self._lib.check(self._lib._c.kvh_sequence_create(self._handle, ctypes.byref(seq_id)))
        return seq_id.value

    def fork(self, parent):
        child = ctypes.c_int64()
        self._lib.check(self._lib._c.kvh_sequence_fork(self._handle, parent, ctypes.byref(child)))
        return child.value

    def truncate(self, seq_id, length):
        self._lib.check(self._lib._c.kvh_sequence_truncate(self._handle, seq_id, length))

    def drop_outside_window(self, seq_id, window):
        """kvh_sequence_drop_outside_window: frees the leading blocks no future query of an all-sliding model
        sees; returns how many leading positions are dropped in all."""
        dropped = ctypes.c_int64()
        self._lib.check(self._lib._c.kvh_sequence_drop_outside_window(self._handle, seq_id, window,
                                                                      ctypes.byref(dropped)))
        return dropped.value

    def length(self, seq_id):
        """The sequence's length; KvheadError (NOT_FOUND) for an unknown or freed id."""
        length = self._lib._c.kvh_sequence_length(self._handle, seq_id)
        if length < 0:
            raise KvheadError(NOT_FOUND, self._lib._c.kvh_last_error().decode(errors="replace"))
        return length

    def free(self, seq_id):
        self._lib.check(self._lib._c.kvh_sequence_free(self._handle, seq_id))

    def _rows(self, layer, seq_ids, num_tokens, x):
        ids, ids_p = _int64s(seq_ids)
        tokens, tokens_p = _int64s(num_tokens)
        if ids.shape != tokens.shape or ids.ndim != 1:
            raise ValueError("seq_ids and num_tokens must be lists of one length")
        x, x_p = _floats(x)
        if x.shape != (int(tokens.sum()), layer.d_model):
            raise ValueError(f"x has shape {x.shape}; expected [sum(num_tokens) = {int(tokens.sum())}, "
                             f"{layer.d_model}]")
        y = np.empty_like(x)
        return (ids, tokens, x, y), (ids_p, tokens_p, len(ids), x_p, y.ctypes.data_as(_float_p))

    def decode(self, layer, seq_ids, num_tokens, x):
        """Appends num_tokens[i] tokens to seq_ids[i] and runs the layer (one-layer cache): x and the returned
        y are [sum(num_tokens), d_model], the sequences' rows back to back."""
        keep, (ids_p, tokens_p, count, x_p, y_p) = self._rows(layer, seq_ids, num_tokens, x)
        self._lib.check(self._lib._c.kvh_decode(layer._handle, self._handle, ids_p, tokens_p, count, x_p, y_p))
        return keep[3]

    def append(self, seq_ids, num_tokens):
        """Reserves num_tokens[i] new positions of seq_ids[i] in every layer (multi-layer decoding)."""
        ids, ids_p = _int64s(seq_ids)
        tokens, tokens_p = _int64s(num_tokens)
        if ids.shape != tokens.shape or ids.ndim != 1:
            raise ValueError("seq_ids and num_tokens must be lists of one length")
        self._lib.check(self._lib._c.kvh_sequence_append(self._handle, ids_p, tokens_p, len(ids)))

    def decode_layer(self, layer, layer_index, seq_ids, num_tokens, x):
        """Layer layer_index for the newest num_tokens[i] positions (reserved by append) of each sequence."""
        keep, (ids_p, tokens_p, count, x_p, y_p) = self._rows(layer, seq_ids, num_tokens, x)
        self._lib.check(self._lib._c.kvh_decode_layer(layer._handle, self._handle, layer_index, ids_p, tokens_p,
                                                      count, x_p, y_p))
        return keep[3]

    def destroy(self):
        if self._handle:
            self._lib._c.kvh_cache_destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.destroy()

    def __del__(self):
        self.destroy()
