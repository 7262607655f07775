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

A Hugging Face model folder's layer: kvhead.model_layer("path/to/model", layer_index=0).

Arrays of real numbers (float, integer or bool dtypes) are converted to
C-contiguous float32 when they are not already; complex, string, object and
masked arrays, and float64 values beyond float32's range, are refused.
Integer arguments (ids, lengths, counts, options) must be integers within
their C type's range, and float options nonzero in float32 when given
nonzero: a value C would wrap, truncate or round to "none" raises instead.
The threading rules are the C API's: calls on distinct sequences may run from
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
                ("kv_block_size", ctypes.c_int32), ("alibi_slopes", ctypes.POINTER(ctypes.c_float))]


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
            "kvh_layer_open_model": (status, [ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(_LayerOptions),
                                              ctypes.POINTER(p)]),
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
              kv_dtype="f32", precision="f32", sliding_window=0, kv_block_size=0, logit_softcap=0.0, sinks=None,
              alibi_slopes=None):
        """kvh_layer_open with these options (kvh_layer_options: 0 means the default; kv_dtype a key of
        KV_DTYPES, precision a key of PRECISIONS, kv_block_size 16, 32, 64, 128 or 256 tokens per block of its
        caches, sinks None or num_heads logits, alibi_slopes None or num_heads slopes)."""
        return Layer(self, path, num_heads=num_heads, num_kv_heads=num_kv_heads, rope_theta=rope_theta,
                     scale=scale, prefix=prefix, threads=threads, kv_dtype=kv_dtype, precision=precision,
                     sliding_window=sliding_window, kv_block_size=kv_block_size, logit_softcap=logit_softcap,
                     sinks=sinks, alibi_slopes=alibi_slopes)

    def model_layer(self, folder, layer_index, threads=0, kv_dtype="f32", precision="f32", kv_block_size=0):
        """kvh_layer_open_model: layer layer_index of a Hugging Face model folder, everything else from its
        config.json and weights."""
        return Layer(self, folder, layer_index=layer_index, threads=threads, kv_dtype=kv_dtype, precision=precision,
                     kv_block_size=kv_block_size)

    def cache(self, layer, byte_budget, num_layers=1):
        """A Cache for num_layers layers of the layer's geometry."""
        return Cache(self, layer, byte_budget, num_layers)


_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_SIZE = (0, (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1)


def _integer(name, value, bounds):
    """value as a Python int within bounds (a C type's range): bool, float, str and the rest raise TypeError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{name} = {value} is outside the C type's range [{bounds[0]}, {bounds[1]}]")
    return value


def _float32(name, value):
    """value for a C float: a real number that float32 holds, and not rounded to 0 (which means "none")."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond double's range
        raise ValueError(f"{name} = {value!r} is beyond float32's range") from None
    if np.isfinite(number) and abs(number) > np.finfo(np.float32).max:
        raise ValueError(f"{name} = {value!r} is beyond float32's range")
    single = np.float32(number)  # NaN and +-Inf as they are, for the library to name
    if number != 0.0 and single == 0.0:
        raise ValueError(f"{name} = {value!r} rounds to 0 as a float32, which would mean none (or the default)")
    return float(single)


def _text(name, value):
    """value as bytes for a C string: no NUL inside, which would cut it short."""
    encoded = os.fsencode(value) if not isinstance(value, bytes) else value
    if b"\0" in encoded:
        raise ValueError(f"{name} {value!r} holds a NUL character")
    return encoded


def _array(name, values):
    if isinstance(values, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: pass np.ma.filled(...) or a plain array")
    return np.asarray(values)


def _floats(array, name="x"):
    """array (real numbers) as C-contiguous, aligned float32 of the same shape (0-d stays 0-d, so that errors name
    the caller's shape) and a pointer to it (keep the array alive while the pointer is used)."""
    source = _array(name, array)
    if source.dtype.kind not in "fiub":
        raise TypeError(f"{name} must hold real numbers, got dtype {source.dtype}")
    with np.errstate(over="ignore"):
        array = np.require(source, dtype=np.float32, requirements=["C", "A"])
    if source.dtype.kind == "f" and source.dtype.itemsize > 4 and np.any(np.isinf(array) & np.isfinite(source)):
        raise ValueError(f"{name} holds finite values beyond float32's range")
    return array, array.ctypes.data_as(_float_p)


def _int64s(values, name):
    """values (integers, or an empty list) as a C-contiguous, aligned int64 array and a pointer to it (a misaligned
    buffer is copied: the C API reads whole int64s)."""
    source = _array(name, values)
    if source.size == 0:
        source = source.astype(np.int64)
    if source.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers within int64, got dtype {source.dtype}")
    if source.dtype.kind == "u" and source.size and int(source.max()) > _INT64[1]:
        raise ValueError(f"{name} holds values beyond int64")
    array = np.require(source, dtype=np.int64, requirements=["C", "A"])
    return array, array.ctypes.data_as(_int64_p)


class Layer:
    """One attention layer (kvh_layer): from a safetensors file (kvh_layer_open, num_heads given), or layer
    layer_index of a Hugging Face model folder (kvh_layer_open_model). Close it, or use it in a with block."""

    def __init__(self, library, path, num_heads=0, num_kv_heads=0, rope_theta=0.0, scale=0.0, prefix=None,
                 threads=0, kv_dtype="f32", precision="f32", sliding_window=0, kv_block_size=0, logit_softcap=0.0,
                 sinks=None, layer_index=None, alibi_slopes=None):
        self._handle = None
        self._lib, c = library, library._c
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPES)}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
        options = _LayerOptions()
        c.kvh_layer_options_init_sized(ctypes.byref(options), ctypes.sizeof(options))
        options.num_heads = _integer("num_heads", num_heads, _INT32)
        options.num_kv_heads = _integer("num_kv_heads", num_kv_heads, _INT32)
        options.threads = _integer("threads", threads, _INT32)
        options.kv_dtype, options.precision = KV_DTYPES[kv_dtype], PRECISIONS[precision]
        options.rope_theta = _float32("rope_theta", rope_theta)
        options.scale = _float32("scale", scale)
        options.logit_softcap = _float32("logit_softcap", logit_softcap)
        options.sliding_window = _integer("sliding_window", sliding_window, _INT64)
        options.kv_block_size = _integer("kv_block_size", kv_block_size, _INT32)
        options.prefix = _text("prefix", prefix) if prefix is not None else None
        sink_values = slope_values = None  # kept alive until kvh_layer_open has copied them
        if sinks is not None:
            sink_values, options.sinks = _floats(sinks, "sinks")
            if sink_values.shape != (num_heads,):
                raise ValueError(f"sinks has shape {sink_values.shape}; expected [num_heads = {num_heads}]")
        if alibi_slopes is not None:
            slope_values, options.alibi_slopes = _floats(alibi_slopes, "alibi_slopes")
            if slope_values.shape != (num_heads,):
                raise ValueError(f"alibi_slopes has shape {slope_values.shape}; expected [num_heads = {num_heads}]")
        handle = ctypes.c_void_p()
        if layer_index is None:
            library.check(c.kvh_layer_open(_text("path", path), ctypes.byref(options), ctypes.byref(handle)))
        else:
            library.check(c.kvh_layer_open_model(_text("folder", path), _integer("layer_index", layer_index, _INT32),
                                                 ctypes.byref(options), ctypes.byref(handle)))
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
        if getattr(self, "_handle", None):  # also after a constructor that raised
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
        self._handle = None
        self._lib = library
        handle = ctypes.c_void_p()
        library.check(library._c.kvh_cache_create_layers(layer._handle, _integer("num_layers", num_layers, _INT32),
                                                         _integer("byte_budget", byte_budget, _SIZE),
                                                         ctypes.byref(handle)))
        self._handle = handle
        self.num_layers = library._c.kvh_cache_num_layers(handle)

    def _error(self):
        """KvheadError for a call that returned -1: INVALID_ARGUMENT once destroyed, else NOT_FOUND (an id)."""
        if not self._handle:
            return KvheadError(INVALID_ARGUMENT, "the cache has been destroyed")
        return KvheadError(NOT_FOUND, self._lib._c.kvh_last_error().decode(errors="replace"))

    @property
    def free_tokens(self):
        tokens = self._lib._c.kvh_cache_free_tokens(self._handle)
        if tokens < 0:
            raise self._error()
        return tokens

    def create(self):
        """A new empty sequence's id (ids are never reused)."""
        seq_id = ctypes.c_int64()
        self._lib.check(self._lib._c.kvh_sequence_create(self._handle, ctypes.byref(seq_id)))
        return seq_id.value

    def fork(self, parent):
        child = ctypes.c_int64()
        self._lib.check(self._lib._c.kvh_sequence_fork(self._handle, _integer("parent", parent, _INT64),
                                                       ctypes.byref(child)))
        return child.value

    def truncate(self, seq_id, length):
        self._lib.check(self._lib._c.kvh_sequence_truncate(self._handle, _integer("seq_id", seq_id, _INT64),
                                                           _integer("length", length, _INT64)))

    def drop_outside_window(self, seq_id, window):
        """kvh_sequence_drop_outside_window: frees the leading blocks no future query of an all-sliding model
        sees; returns how many leading positions are dropped in all."""
        dropped = ctypes.c_int64()
        self._lib.check(self._lib._c.kvh_sequence_drop_outside_window(
            self._handle, _integer("seq_id", seq_id, _INT64), _integer("window", window, _INT64),
            ctypes.byref(dropped)))
        return dropped.value

    def length(self, seq_id):
        """The sequence's length; KvheadError (NOT_FOUND) for an unknown or freed id."""
        length = self._lib._c.kvh_sequence_length(self._handle, _integer("seq_id", seq_id, _INT64))
        if length < 0:
            raise self._error()
        return length

    def free(self, seq_id):
        self._lib.check(self._lib._c.kvh_sequence_free(self._handle, _integer("seq_id", seq_id, _INT64)))

    def _rows(self, layer, seq_ids, num_tokens, x):
        ids, ids_p = _int64s(seq_ids, "seq_ids")
        tokens, tokens_p = _int64s(num_tokens, "num_tokens")
        if ids.shape != tokens.shape or ids.ndim != 1:
            raise ValueError("seq_ids and num_tokens must be lists of one length")
        x, x_p = _floats(x)
        total = sum(int(count) for count in tokens.tolist())  # exact: an int64 sum could wrap
        if x.shape != (total, layer.d_model):
            raise ValueError(f"x has shape {x.shape}; expected [sum(num_tokens) = {total}, {layer.d_model}]")
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
        ids, ids_p = _int64s(seq_ids, "seq_ids")
        tokens, tokens_p = _int64s(num_tokens, "num_tokens")
        if ids.shape != tokens.shape or ids.ndim != 1:
            raise ValueError("seq_ids and num_tokens must be lists of one length")
        self._lib.check(self._lib._c.kvh_sequence_append(self._handle, ids_p, tokens_p, len(ids)))

    def decode_layer(self, layer, layer_index, seq_ids, num_tokens, x):
        """Layer layer_index for the newest num_tokens[i] positions (reserved by append) of each sequence."""
        keep, (ids_p, tokens_p, count, x_p, y_p) = self._rows(layer, seq_ids, num_tokens, x)
        self._lib.check(self._lib._c.kvh_decode_layer(layer._handle, self._handle,
                                                      _integer("layer_index", layer_index, _INT32), ids_p, tokens_p,
                                                      count, x_p, y_p))
        return keep[3]

    def destroy(self):
        if getattr(self, "_handle", None):  # also after a constructor that raised
            self._lib._c.kvh_cache_destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.destroy()

    def __del__(self):
        self.destroy()
