"""Plain data as an HDF5 tree and back: the checkpoint of a results file, without pickle.

A checkpoint is a tree of dicts (string keys), lists and tuples whose leaves are tensors,
numbers, booleans, strings and None. `write_tree` stores it as HDF5 groups and datasets, each
object tagged with an attribute ``kind``; `read_tree` rebuilds it. Reading creates nothing but
those types: a file shared by a collaborator can be wrong, but it cannot run code, which the
pickle inside ``torch.save`` could (a crafted ``.h5`` once ran a shell command through it).

Layout of one node ``name`` under a group:

- dict / list / tuple: a group with ``kind`` = ``dict`` | ``list`` | ``tuple``; a list's items
  are named ``0, 1, …``; a dict keeps its keys' order.
- tensor: a dataset with ``kind = tensor`` (its dtype and shape; bool, integer, float and
  complex dtypes).
- int, float, bool, str, None: a scalar dataset with ``kind`` = ``int`` | ``float`` | ``bool``
  | ``str`` | ``none``.
"""

from __future__ import annotations

import h5py
import numpy as np
import torch

# A tree is read whole into memory: refuse what no checkpoint of ours comes near (the 6x6
# ViT's 44,864 parameters take 350 kB; 65,536 chains of 1,024 sites 512 MiB) before h5py
# allocates it.
MAX_LEAF_BYTES = 2**31
MAX_NODES = 100_000
MAX_DEPTH = 32

_CONTAINERS = {"dict": dict, "list": list, "tuple": tuple}
_TORCH_DTYPES = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64,
    np.dtype(np.complex128): torch.complex128,
}


class TreeError(ValueError):
    """The data cannot be written as a tree, or the HDF5 objects are not a tree we wrote."""


# ---- writing -------------------------------------------------------------------------------


def write_tree(group: h5py.Group, name: str, value) -> None:
    """Writes ``value`` as the node ``name`` of ``group``; TreeError for an unsupported type."""
    if isinstance(value, dict):
        _write_container(group, name, "dict", value.items())
    elif isinstance(value, (list, tuple)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        _write_container(group, name, kind, ((str(i), item) for i, item in enumerate(value)))
    elif isinstance(value, torch.Tensor):
        array = value.detach().cpu().resolve_conj().numpy()
        if array.dtype not in _TORCH_DTYPES:
            raise TreeError(f"{group.name}/{name}: tensors of dtype {value.dtype} are not stored")
        group.create_dataset(name, data=array).attrs["kind"] = "tensor"
    else:
        kind, data = _scalar(value, f"{group.name}/{name}")
        group.create_dataset(name, data=data).attrs["kind"] = kind


def _write_container(group: h5py.Group, name: str, kind: str, items) -> None:
    node = group.create_group(name, track_order=True)
    node.attrs["kind"] = kind
    for key, item in items:
        if not isinstance(key, str) or not key or "/" in key or key == ".":
            raise TreeError(f"{node.name}: key {key!r} is not a plain name")
        write_tree(node, key, item)


def _scalar(value, where: str):
    if value is None:
        return "none", h5py.Empty("f8")
    if isinstance(value, (bool, np.bool_)):
        return "bool", np.bool_(value)
    if isinstance(value, (int, np.integer)):
        return "int", np.int64(value)
    if isinstance(value, (float, np.floating)):
        return "float", np.float64(value)
    if isinstance(value, str):
        return "str", value
    raise TreeError(f"{where}: values of type {type(value).__name__} are not stored")


# ---- reading -------------------------------------------------------------------------------


def read_tree(node: h5py.Group | h5py.Dataset):
    """Returns the value stored at ``node`` by `write_tree` (tensors on CPU).

    Raises TreeError for an object without a known ``kind``, a link that is not a plain
    (hard) link inside the file, a dataset larger than ``MAX_LEAF_BYTES`` or of a dtype a
    tensor cannot have, and trees deeper than ``MAX_DEPTH`` or larger than ``MAX_NODES``.
    """
    return _read(node, depth=0, budget=[MAX_NODES])


def _read(node, depth: int, budget: list[int]):
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise TreeError(f"{node.name}: more than {MAX_NODES} objects or {MAX_DEPTH} levels")
    kind = _kind(node)
    if kind in _CONTAINERS:
        if not isinstance(node, h5py.Group):
            raise TreeError(f"{node.name}: kind {kind!r} must be a group")
        children = [(key, _read(child, depth + 1, budget)) for key, child in _children(node)]
        if kind == "dict":
            return dict(children)
        items = _in_order(node, children)
        return items if kind == "list" else tuple(items)
    if not isinstance(node, h5py.Dataset):
        raise TreeError(f"{node.name}: kind {kind!r} must be a dataset")
    if kind == "tensor":
        return _read_tensor(node)
    return _read_scalar(node, kind)


def _kind(node) -> str:
    kind = node.attrs.get("kind")
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "replace")
    allowed = (*_CONTAINERS, "tensor", "int", "float", "bool", "str", "none")
    if kind not in allowed:
        raise TreeError(f"{node.name}: kind {kind!r} is not one of {list(allowed)}")
    return kind


def _children(group: h5py.Group):
    """Yields (name, object) of ``group``'s members, refusing soft and external links: they
    would make reading this file open other files or objects chosen by whoever wrote it."""
    for key in group:
        link = group.get(key, getlink=True)
        if not isinstance(link, h5py.HardLink):
            raise TreeError(f"{group.name}/{key}: a {type(link).__name__}; only plain data is read")
        yield key, group[key]


def _in_order(group: h5py.Group, children: list) -> list:
    expected = [str(i) for i in range(len(children))]
    if sorted(key for key, _ in children) != sorted(expected):
        raise TreeError(f"{group.name}: list items must be named 0..{len(children) - 1}")
    values = dict(children)
    return [values[key] for key in expected]


def stored_here(dataset: h5py.Dataset) -> str | None:
    """Returns why reading ``dataset`` would read anything but bytes stored in its own file
    for every value it declares, or None when it reads just those.

    Refused: *external* storage (the values are the bytes of any file the writer named),
    a *virtual* dataset (they come from other HDF5 files), filters (a compressed dataset
    declares what it likes: 2 kB of gzip inflate to 800 kB of zeros; vitqs writes none), and
    declared values without stored bytes (unwritten chunks read as fill values: a 13 kB file
    declaring 200,000 rows once cost a report 555 MB). Memory and time are then bounded by
    the size of the file itself.
    """
    if dataset.is_virtual:
        return "a virtual dataset, whose values come from other files"
    if dataset.external:
        return "stored in external files, not in this one"
    if dataset.id.get_create_plist().get_nfilters():
        return "compressed or filtered (vitqs writes plain data; h5repack -f NONE undoes it)"
    if dataset.shape is None:  # an empty dataspace (h5py.Empty) declares no values
        return None
    declared = int(np.prod(dataset.shape, dtype=np.float64)) * dataset.dtype.itemsize
    if dataset.id.get_storage_size() < declared:
        return f"declares {declared:,} bytes of values but stores {dataset.id.get_storage_size():,}"
    return None


def _check_size(dataset: h5py.Dataset) -> None:
    if dataset.dtype.kind not in "biufc" or dataset.dtype not in _TORCH_DTYPES:
        raise TreeError(f"{dataset.name}: dtype {dataset.dtype} is not a tensor dtype")
    size = int(np.prod(dataset.shape, dtype=np.float64)) * dataset.dtype.itemsize
    if size > MAX_LEAF_BYTES:
        raise TreeError(f"{dataset.name}: {size:,} bytes, above the {MAX_LEAF_BYTES:,} read")
    _check_stored_here(dataset)


def _check_stored_here(dataset: h5py.Dataset) -> None:
    problem = stored_here(dataset)
    if problem is not None:
        raise TreeError(f"{dataset.name}: {problem}; only data stored in the file is read")


def _read_tensor(dataset: h5py.Dataset) -> torch.Tensor:
    _check_size(dataset)
    array = np.asarray(dataset[()])
    return torch.from_numpy(np.ascontiguousarray(array)).to(_TORCH_DTYPES[array.dtype])


def _read_scalar(dataset: h5py.Dataset, kind: str):
    if kind == "none":
        return None
    _check_stored_here(dataset)
    if kind == "str":
        if dataset.shape != () or dataset.dtype.kind not in "OS":
            raise TreeError(f"{dataset.name}: a str must be a scalar string")
        value = dataset[()]
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    if dataset.shape != ():
        raise TreeError(f"{dataset.name}: a {kind} must be a scalar, not of shape {dataset.shape}")
    _check_size(dataset)
    value = dataset[()]
    if kind == "bool":
        return bool(value)
    if kind == "int":
        if dataset.dtype.kind not in "iub":
            raise TreeError(f"{dataset.name}: an int stored as {dataset.dtype}")
        return int(value)
    if dataset.dtype.kind == "c":
        raise TreeError(f"{dataset.name}: a float stored as {dataset.dtype}")
    return float(value)
