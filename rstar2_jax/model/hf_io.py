"""Hugging Face checkpoints: load ``config.json`` + safetensors into the NNX policy, and export back.

Both directions hold at most one tensor's local slices on the host at a time, in one process or many.

Loading (:func:`load_hf`) builds the model abstractly (``nnx.eval_shape``), checks every tensor's
name and shape against the safetensors headers before reading anything, then builds each parameter
from its devices' pieces (as ``jax.make_array_from_callback`` would, without its host copy of every
local slice): for each distinct slice its devices hold, a process reads only the rows of that slice
(positioned reads of a few MiB; no mmap, so no page of the file stays resident), converts it to our
layout and casts it to ``param_dtype`` in one copy, and puts it on its devices before reading the
next. There is no cross-process collective; what stays is each process's own devices' shards (half
of an fsdp-sharded model on 2 processes). Files are parsed by their header (the safetensors format),
so F32/F16/BF16/F8 files need nothing of ``safetensors``' numpy or flax readers.

Exporting (:func:`export_hf`) computes every file's header from the params' shapes and dtypes, so
process 0 writes the headers and sizes the files up front; then every process writes the device
shards it holds (one replica of each) into place, one shard at a time. Multi-process export needs
a directory every process sees (one host, or a shared file system). The files are ordinary
safetensors (``safe_open``, ``transformers``), sharded with ``model.safetensors.index.json`` when
over ``max_shard_bytes``.

Layout map (ours <- HF ``[out, in]`` weights), each a :class:`Layout` (HF dims split, then permuted):
  embed [V,D] <- model.embed_tokens.weight [V,D]        lm_head [D,V] <- lm_head.weight [V,D]
  attn.q_proj [D,N,H] <- q_proj.weight [N*H,D]          attn.o_proj [N,H,D] <- o_proj.weight [D,N*H]
  mlp.gate_proj/up_proj [D,F] <- [F,D]                  mlp.down_proj [F,D] <- [D,F]
"""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
import os
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.qwen3 import Qwen3
from rstar2_jax.model.sharding import param_shardings

READ_CHUNK_BYTES = 8 * 2**20  # a column slice is read in runs of whole rows of about this size

# safetensors dtype names <-> numpy (little-endian; bf16/f8 from ml_dtypes)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_DTYPE_NAMES = {v.name: k for k, v in DTYPES.items()}  # numpy dtype name -> safetensors name


class CheckpointError(ValueError):
    """A checkpoint does not match the model: names the tensor (and shapes) that is wrong."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one HF tensor maps to our parameter: HF dim ``i`` is split (row-major) into the dims of
    ``groups[i]``, then our dim ``j`` is split dim ``perm[j]``. E.g. q_proj HF ``[N*H, D]``:
    ``groups=((N, H), (D,))``, ``perm=(2, 0, 1)`` -> ours ``[D, N, H]``.

    ``to_ours`` / ``to_hf`` convert whole arrays; ``read`` / ``write`` convert one slice of ours
    (a tuple of contiguous slices, as ``make_array_from_callback`` and ``Shard.index`` give) from /
    into the HF tensor, touching only the HF rows that slice needs."""

    groups: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]

    @property
    def split_shape(self) -> tuple[int, ...]:
        return tuple(s for g in self.groups for s in g)

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(g) for g in self.groups)

    @property
    def shape(self) -> tuple[int, ...]:
        """Our parameter's shape."""
        return tuple(self.split_shape[p] for p in self.perm)

    def to_ours(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x).reshape(self.split_shape).transpose(self.perm)

    def to_hf(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y).transpose(np.argsort(self.perm)).reshape(self.hf_shape)

    def _split_index(self, idx: tuple) -> list[tuple[int, int]]:
        """Our slice -> ``(start, stop)`` per split dim."""
        idx = tuple(idx) + (slice(None),) * (len(self.perm) - len(idx))
        out: list[Any] = [None] * len(self.perm)
        for j, s in enumerate(idx):
            n = self.split_shape[self.perm[j]]
            start, stop, step = s.indices(n)
            if step != 1:
                raise ValueError(f"Layout slices must be contiguous, got {s}")
            out[self.perm[j]] = (start, stop)
        return out

    def read(self, read_box: Callable[[tuple[slice, ...]], np.ndarray], idx: tuple) -> np.ndarray:
        """Our slice ``idx`` of the tensor, where ``read_box(hf_slices)`` returns an HF-layout box.

        A split HF dim is read over the rows of its outer part's range (``start * inner ..
        stop * inner``); its inner parts are sliced after the reshape."""
        sp = self._split_index(idx)
        box, shape, post, k = [], [], [], 0
        for g in self.groups:
            (a, b), inner = sp[k], math.prod(g[1:])
            box.append(slice(a * inner, b * inner))
            shape += [b - a, *g[1:]]
            post += [slice(None)] + [slice(*sp[i]) for i in range(k + 1, k + len(g))]
            k += len(g)
        x = read_box(tuple(box)).reshape(shape)[tuple(post)]
        return x.transpose(self.perm)

    def write(self, hf: np.ndarray, idx: tuple, y: np.ndarray) -> None:
        """Store our slice ``idx`` (values ``y``) into the HF-layout array ``hf`` (e.g. a memmap)."""
        sp = self._split_index(idx)
        hf.reshape(self.split_shape)[tuple(slice(a, b) for a, b in sp)] = np.asarray(y).transpose(np.argsort(self.perm))


def _name_map(cfg: ModelConfig) -> dict[tuple, tuple[str, Layout]]:
    """our param path -> (HF tensor name, layout)."""
    d, n, k, h, f, v = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                        cfg.vocab_size)

    def ident(*shape):
        return Layout(tuple((s,) for s in shape), tuple(range(len(shape))))

    def tr(rows, cols):  # HF [rows, cols] -> ours [cols, rows]
        return Layout(((rows,), (cols,)), (1, 0))

    def proj(heads):  # HF [heads*H, D] -> ours [D, heads, H]
        return Layout(((heads, h), (d,)), (2, 0, 1))

    def bias(heads):  # HF [heads*H] -> ours [heads, H]
        return Layout(((heads, h),), (0, 1))

    out = {("embed",): ("model.embed_tokens.weight", ident(v, d)),
           ("final_norm", "weight"): ("model.norm.weight", ident(d))}
    if not cfg.tie_embeddings:
        out[("lm_head",)] = ("lm_head.weight", tr(v, d))
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        L = ("layers", i)
        out[L + ("input_norm", "weight")] = (p + "input_layernorm.weight", ident(d))
        out[L + ("post_attn_norm", "weight")] = (p + "post_attention_layernorm.weight", ident(d))
        out[L + ("attn", "q_proj")] = (p + "self_attn.q_proj.weight", proj(n))
        out[L + ("attn", "k_proj")] = (p + "self_attn.k_proj.weight", proj(k))
        out[L + ("attn", "v_proj")] = (p + "self_attn.v_proj.weight", proj(k))
        out[L + ("attn", "o_proj")] = (p + "self_attn.o_proj.weight", Layout(((d,), (n, h)), (1, 2, 0)))
        if cfg.qkv_bias:
            out[L + ("attn", "q_bias")] = (p + "self_attn.q_proj.bias", bias(n))
            out[L + ("attn", "k_bias")] = (p + "self_attn.k_proj.bias", bias(k))
            out[L + ("attn", "v_bias")] = (p + "self_attn.v_proj.bias", bias(k))
        if cfg.qk_norm:
            out[L + ("attn", "q_norm", "weight")] = (p + "self_attn.q_norm.weight", ident(h))
            out[L + ("attn", "k_norm", "weight")] = (p + "self_attn.k_norm.weight", ident(h))
        out[L + ("mlp", "gate_proj")] = (p + "mlp.gate_proj.weight", tr(f, d))
        out[L + ("mlp", "up_proj")] = (p + "mlp.up_proj.weight", tr(f, d))
        out[L + ("mlp", "down_proj")] = (p + "mlp.down_proj.weight", tr(d, f))
    return out


def _path_key(path) -> tuple:
    out = []
    for e in path:
        for attr in ("key", "idx", "name"):
            if hasattr(e, attr):
                out.append(getattr(e, attr))
                break
    return tuple(out)


def _var_path(key: tuple) -> tuple:
    return key[:-1] if key and key[-1] == "value" else key


# -- safetensors files -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file: dtype name, shape, absolute byte range in the file."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(file: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file, from its header (8-byte little-endian length + JSON)."""
    size = file.stat().st_size
    with open(file, "rb") as fh:
        raw = fh.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if not 0 < n <= size - 8:
            raise CheckpointError(f"{file}: not a safetensors file (header length {n}, file size {size})")
        header = json.loads(fh.read(n))
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = TensorInfo(file, t["dtype"], tuple(t["shape"]), 8 + n + b, 8 + n + e)
        if out[name].end > size:
            raise CheckpointError(f"{file}: tensor {name!r} ends at byte {out[name].end}, past the file ({size})")
    return out


def _tensor_index(ckpt_dir: Path) -> dict[str, TensorInfo]:
    """HF tensor name -> its file and place, for single-file or sharded (index.json) checkpoints."""
    index = ckpt_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        headers = {file: read_header(ckpt_dir / file) for file in sorted(set(weight_map.values()))}
        out = {}
        for name, file in weight_map.items():
            if name not in headers[file]:
                raise CheckpointError(f"{ckpt_dir}: index maps tensor {name!r} to {file}, which does not hold it")
            out[name] = headers[file][name]
        return out
    single = ckpt_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{ckpt_dir}: no model.safetensors or model.safetensors.index.json")
    return read_header(single)


def _host_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty`` with its own anonymous mapping (from 1 MiB): freeing it returns the pages at once,
    where a malloc'd temporary can stay resident as a hole between the device buffers."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < 2**20:
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)


class _Scratch:
    """Reusable host buffers of one load (grown when needed, freed with the load), so reading does not
    fault fresh pages in for every slice: only for buffers that never reach ``device_put`` (XLA:CPU
    may alias an aligned numpy array instead of copying it, even with ``may_alias=False``)."""

    def __init__(self) -> None:
        self.bufs: dict[str, np.ndarray] = {}

    def array(self, slot: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if slot not in self.bufs or self.bufs[slot].size < nbytes:
            self.bufs.pop(slot, None)
            self.bufs[slot] = _host_empty((max(nbytes, 1),), np.uint8)
        return self.bufs[slot][:nbytes].view(dtype).reshape(shape)


class _TensorReader:
    """Positioned reads of boxes of one tensor (an open file; no mmap, so nothing stays resident)."""

    def __init__(self, name: str, info: TensorInfo) -> None:
        if info.dtype not in DTYPES:
            raise CheckpointError(f"{info.file}: tensor {name!r} has unsupported dtype {info.dtype!r}")
        self.info, self.dtype = info, DTYPES[info.dtype]
        if info.end - info.begin != math.prod(info.shape) * self.dtype.itemsize:
            raise CheckpointError(f"{info.file}: tensor {name!r} has {info.end - info.begin} bytes, "
                                  f"its shape {info.shape} and dtype {info.dtype} need "
                                  f"{math.prod(info.shape) * self.dtype.itemsize}")
        self.fh = open(info.file, "rb", buffering=0)

    def close(self) -> None:
        self.fh.close()

    def _read_into(self, out: np.ndarray, offset: int) -> None:
        view, pos = memoryview(out.reshape(-1).view(np.uint8)), 0
        while pos < len(view):
            got = os.preadv(self.fh.fileno(), [view[pos:]], offset + pos)
            if got <= 0:
                raise CheckpointError(f"{self.info.file}: short read at byte {offset + pos}")
            pos += got

    def box(self, box: tuple[slice, ...], scratch: _Scratch | None = None, into_scratch: bool = False) -> np.ndarray:
        """``tensor[box]`` (contiguous slices, one per dim): whole rows of dim 0 read in runs of about
        ``READ_CHUNK_BYTES`` (into ``scratch``'s ``"chunk"`` buffer when given), the other dims sliced
        from each run (read directly when full). The result is a fresh array (it may become a device
        buffer), or with ``into_scratch`` a view of ``scratch``'s ``"raw"`` buffer (valid until the
        next call; copy it before it goes to a device)."""
        shape = self.info.shape
        if not shape:
            out = np.empty((), self.dtype)
            self._read_into(out, self.info.begin)
            return out
        r0, r1, _ = box[0].indices(shape[0])
        rest = tuple(box[1:]) + (slice(None),) * (len(shape) - len(box))
        rest_idx = [s.indices(n)[:2] for s, n in zip(rest, shape[1:])]
        row_items = math.prod(shape[1:])
        row_bytes = row_items * self.dtype.itemsize
        out_shape = (r1 - r0, *(b - a for a, b in rest_idx))
        out = (scratch.array("raw", out_shape, self.dtype) if into_scratch and scratch is not None
               else _host_empty(out_shape, self.dtype))
        if out.size == 0:
            return out
        if all((a, b) == (0, n) for (a, b), n in zip(rest_idx, shape[1:])):
            self._read_into(out, self.info.begin + r0 * row_bytes)
            return out
        step = max(1, READ_CHUNK_BYTES // max(row_bytes, 1))
        chunk = (min(step, r1 - r0), *shape[1:])
        buf = _host_empty(chunk, self.dtype) if scratch is None else scratch.array("chunk", chunk, self.dtype)
        sel = (slice(None),) + tuple(slice(a, b) for a, b in rest_idx)
        for r in range(r0, r1, step):
            m = min(step, r1 - r)
            self._read_into(buf[:m], self.info.begin + r * row_bytes)
            out[r - r0:r - r0 + m] = buf[:m][sel]
        return out


_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _cast(host: np.ndarray, dtype: np.dtype, copy: bool = False) -> np.ndarray:
    """``host`` as a C-contiguous ``dtype`` array: itself (unless ``copy``), or one copy (the layout
    transpose and the cast together)."""
    if host.flags.c_contiguous and host.dtype == dtype and not copy:
        return host
    out = _host_empty(host.shape, dtype)
    np.copyto(out, host, casting="unsafe")
    return out


def _place(shape: tuple[int, ...], sharding: jax.sharding.Sharding, dtype: np.dtype,
           read: Callable[[tuple[slice, ...]], np.ndarray]) -> jax.Array:
    """A global array of ``shape`` with ``sharding`` from ``read(index)`` of this process's slices
    (fresh arrays in any layout and dtype; cast to ``dtype``).

    Like ``jax.make_array_from_callback`` (no communication), but each distinct slice is read once
    and copied to its devices before the next is read, so the host holds one slice at a time (the
    callback form holds every local slice on the host until it has put them all)."""
    index_map = sharding.addressable_devices_indices_map(shape)
    groups: dict[tuple, list] = {}
    for device, idx in index_map.items():
        k = tuple(s.indices(n)[:2] for s, n in zip(idx, shape))
        groups.setdefault(k, [idx, []])[1].append(device)
    arrays = {}
    for idx, devices in groups.values():
        host = _cast(read(idx), dtype)
        # a copy, or on CPU the host buffer itself (XLA:CPU aliases an aligned array); the other devices
        # copy from the first, so no two devices share a buffer (a donation would write into both)
        arrays[devices[0]] = jax.device_put(host, devices[0])
        for device in devices[1:]:
            arrays[device] = jax.device_put(arrays[devices[0]], device)
        jax.block_until_ready([arrays[d] for d in devices])  # copied (if at all): the next slice may come
        del host
    return jax.make_array_from_single_device_arrays(
        shape, sharding, [arrays[d] for d in index_map])


def load_hf(path: str | Path, *, mesh: Mesh | None = None, dtype: str | None = None,
            param_dtype: str | None = None) -> tuple[nnx.GraphDef, nnx.State, ModelConfig]:
    """Load an HF Qwen3/Qwen2 directory -> ``(graphdef, params, cfg)``, params placed on ``mesh``
    (``model.param_shardings``; None: the default device, unsharded), cast to ``param_dtype``.

    Each process reads only its own devices' slices of each tensor (no collective; call it in every
    process of a multi-process run). Raises ``CheckpointError`` naming the tensor on a
    missing/unexpected tensor or a shape mismatch, before any tensor is read.
    """
    ckpt_dir = Path(path)
    overrides = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v}
    cfg = ModelConfig.from_hf(ckpt_dir, **overrides)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    shardings = param_shardings(abstract, mesh) if mesh is not None else None
    sharding_leaves = {} if shardings is None else {
        _path_key(p): s for p, s in jax.tree_util.tree_leaves_with_path(shardings)}
    tensors = _tensor_index(ckpt_dir)
    names = _name_map(cfg)
    expected = {hf for hf, _ in names.values()}
    unexpected = sorted(n for n in tensors if n not in expected and not n.endswith(_IGNORED_SUFFIXES))
    if unexpected and not (cfg.tie_embeddings and unexpected == ["lm_head.weight"]):
        raise CheckpointError(f"{ckpt_dir}: unexpected tensor {unexpected[0]!r}"
                              + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    for p, leaf in jax.tree_util.tree_leaves_with_path(abstract):  # every check before any read
        var_path = _var_path(_path_key(p))
        hf_name, layout = names[var_path]
        if hf_name not in tensors:
            raise CheckpointError(f"{ckpt_dir}: missing tensor {hf_name!r} "
                                  f"(for parameter {'/'.join(map(str, var_path))})")
        if tensors[hf_name].shape != layout.hf_shape:
            raise CheckpointError(f"{ckpt_dir}: tensor {hf_name!r} has shape {tensors[hf_name].shape}, "
                                  f"expected {layout.hf_shape}")
        if layout.shape != tuple(leaf.shape):
            raise AssertionError(f"layout of {hf_name} gives {layout.shape}, the model has {tuple(leaf.shape)}")
    pdt = np.dtype(jnp.dtype(cfg.param_dtype))
    scratch = _Scratch()

    def load_one(p, leaf):
        key = _path_key(p)
        hf_name, layout = names[_var_path(key)]
        reader = _TensorReader(hf_name, tensors[hf_name])  # one open file per tensor
        try:
            sharding = sharding_leaves.get(key)
            if sharding is None:
                return jnp.asarray(_cast(layout.read(lambda box: reader.box(box, scratch), ()), pdt))
            # a slice that is transposed or cast is read into the reused raw buffer, then copied once
            copy = reader.dtype != pdt or layout.perm != tuple(sorted(layout.perm))
            return _place(tuple(leaf.shape), sharding, pdt, lambda idx: _cast(
                layout.read(lambda box: reader.box(box, scratch, into_scratch=copy), idx), pdt, copy=copy))
        finally:
            reader.close()

    params = jax.tree_util.tree_map_with_path(load_one, abstract)
    return graphdef, params, cfg


def _local_pieces(x: Any) -> list[tuple[tuple, Callable[[], np.ndarray]]]:
    """The ``(index, host values)`` this process writes of ``x``: one replica of each distinct slice
    (``replica_id == 0``) among its addressable shards; a host array is process 0's."""
    if isinstance(x, jax.Array):
        return [(s.index, lambda s=s: np.asarray(s.data)) for s in x.addressable_shards if s.replica_id == 0]
    return [((), lambda: np.asarray(x))] if jax.process_index() == 0 else []


def _barrier(name: str) -> None:
    """Every process waits here (``multihost_utils.sync_global_devices``); a no-op for one process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def export_hf(path: str | Path, graphdef: nnx.GraphDef, params: nnx.State, cfg: ModelConfig, *,
              max_shard_bytes: int = 5 * 2**30) -> None:
    """Write ``config.json`` + safetensors (sharded with an index when over ``max_shard_bytes``),
    each tensor in its params dtype.

    Process 0 writes the headers (computed from shapes and dtypes) and sizes the files; after a
    barrier every process writes its devices' shards into place (one shard on the host at a time),
    then a barrier. Call it in every process of a multi-process run, with ``path`` on a file system
    they all see.
    """
    out = Path(path)
    names = _name_map(cfg)
    leaves = {_var_path(_path_key(p)): v for p, v in jax.tree_util.tree_leaves_with_path(params)}
    shards: list[list[tuple[str, tuple, Layout, np.dtype]]] = [[]]
    size = 0
    for var_path, (hf_name, layout) in names.items():
        x = leaves[var_path]
        if tuple(x.shape) != layout.shape:
            raise ValueError(f"parameter {'/'.join(map(str, var_path))} has shape {tuple(x.shape)}, "
                             f"the config gives {layout.shape}")
        dt = np.dtype(x.dtype)
        if dt.name not in _DTYPE_NAMES:
            raise ValueError(f"parameter {'/'.join(map(str, var_path))}: dtype {dt} has no safetensors name")
        nbytes = math.prod(layout.hf_shape) * dt.itemsize
        if size and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((hf_name, var_path, layout, dt))
        size += nbytes
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    headers, places = [], {}  # (file, header bytes, data bytes); hf name -> (file, absolute offset)
    for fname, shard in zip(files, shards):
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        pos = 0
        for hf_name, _, layout, dt in shard:
            nbytes = math.prod(layout.hf_shape) * dt.itemsize
            header[hf_name] = {"dtype": _DTYPE_NAMES[dt.name], "shape": list(layout.hf_shape),
                               "data_offsets": [pos, pos + nbytes]}
            places[hf_name] = (fname, pos)
            pos += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        headers.append((fname, raw, pos))
    start = {fname: 8 + len(raw) for fname, raw, _ in headers}
    if jax.process_index() == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
        for fname, raw, data_bytes in headers:
            with open(out / fname, "wb") as fh:
                fh.write(len(raw).to_bytes(8, "little") + raw)
                fh.truncate(8 + len(raw) + data_bytes)
        index = out / "model.safetensors.index.json"
        if len(shards) > 1:
            weight_map = {name: fname for fname, shard in zip(files, shards) for name, *_ in shard}
            index.write_text(json.dumps({"metadata": {"total_size": sum(h[2] for h in headers)},
                                         "weight_map": weight_map}, indent=2))
        elif index.exists():
            index.unlink()  # a stale index would shadow the new single file
    _barrier("rstar2_export_hf_files")
    for shard in shards:
        for hf_name, var_path, layout, dt in shard:
            pieces = _local_pieces(leaves[var_path])
            if not pieces or math.prod(layout.hf_shape) == 0:
                continue
            fname, pos = places[hf_name]
            mm = np.memmap(out / fname, dtype=dt, mode="r+", offset=start[fname] + pos, shape=layout.hf_shape)
            for idx, host in pieces:
                layout.write(mm, idx, host())
                mm.flush()  # its dirty pages leave this process's RSS with each shard
            del mm
    _barrier("rstar2_export_hf_done")
