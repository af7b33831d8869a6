"""The checkpoint: what a run keeps to go on, and the three ways a run starts from one.

A checkpoint is one dict (`CHECKPOINT_ENTRIES`): the model's parameters, the VMC loop's
state, the sampler's chains and generators, torch's generator and the seconds spent. A run
goes on from its own checkpoint (``--resume``, when its config changed only in keys a
resume may change, `keys_with("resumable")`), starts from another run's parameters and
chains (``model.init_from``), or from a sweep's previous point (`checkpoint_parameters`).
A results file is data that anyone may have written: the checkpoint's shape is checked
before any of it is used.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import yaml

from vitqs import results
from vitqs.config import (
    Config,
    ConfigError,
    default_lattice_kind,
    key_defaults,
    keys_with,
    upgrade_stored,
)
from vitqs.errors import first_line
from vitqs.models import load_network_state
from vitqs.models.symmetrize import Symmetrized
from vitqs.models.transfer import grid_of, transfer_state
from vitqs.yamlfile import parse_yaml


def start_from_results(config: Config, model, sampler) -> None:
    """``model.init_from``: loads the parameters of another run's checkpoint into ``model`` and
    starts ``sampler``'s chains from its chains when they are states of this sector."""
    where = f"model.init_from='{config.model.init_from}'"
    try:
        record = results.read_results(config.model.init_from)
    except results.ResultsError as err:
        raise ConfigError(f"{where}: {err}") from None
    if record.checkpoint is None:
        raise ConfigError(f"{where}: the run holds no checkpoint yet; name a run that has one")
    state = checked_state(record.checkpoint, where)
    network_state = _on_this_lattice(state["model"], record, config, model, where)
    try:
        load_network_state(model, network_state)
    except (RuntimeError, TypeError, ValueError, KeyError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or ["?"]
        reason = model_differences(record, config) or lines[-1]
        raise ConfigError(
            f"{where}: its parameters do not fit this model ({reason}); model.* must be "
            "that run's, except symmetrize and spin_flip"
        ) from None
    chains = state["sampler"].get("chains")
    n_sites = sampler.hilbert.n_sites
    if isinstance(chains, torch.Tensor) and chains.shape[-1] == n_sites:  # no sum, same size
        with contextlib.suppress(ValueError):  # another sector: random chains, as usual
            sampler.start_chains(chains)  # checks the chains against the sector itself


def _on_this_lattice(network_state: dict, record, config: Config, model, where: str) -> dict:
    """Returns the init_from run's network state, its attention tables extended to this
    lattice when that run had another size (`models.transfer`)."""
    stored = stored_config(record) or {}
    lattice = stored.get("lattice") if isinstance(stored.get("lattice"), dict) else {}
    shape = lattice.get("shape")
    kind = lattice.get("kind") or (default_lattice_kind(shape) if shape is not None else None)
    if shape is not None and kind != config.lattice.resolved_kind:
        raise ConfigError(
            f"{where}: that run is on a {kind}, lattice.shape={list(shape)}, this one on a "
            f"{config.lattice.resolved_kind}, {list(config.lattice.shape)}: a state carries "
            "over between lattices of one kind"
        )
    if shape is None or list(shape) == list(config.lattice.shape):
        return network_state
    if len(shape) != len(config.lattice.shape):
        raise ConfigError(
            f"{where}: that run is on lattice.shape={list(shape)}, this one on "
            f"{list(config.lattice.shape)}: a state carries over between lattices of one kind"
        )
    stored_model = stored.get("model") if isinstance(stored.get("model"), dict) else {}
    bare = model.model if isinstance(model, Symmetrized) else model
    try:
        source = grid_of(shape, stored_model.get("patch_size", config.model.patch_size))
        network_state = {k.removeprefix("model."): v for k, v in network_state.items()}
        return transfer_state(network_state, bare, source)
    except (IndexError, KeyError, RuntimeError) as err:
        raise ConfigError(
            f"{where}: its parameters are not those of the lattice.shape={list(shape)} its "
            f"config names ({first_line(err)}); the file is not a run of ours as it stands"
        ) from None
    except (ValueError, TypeError) as err:
        raise ConfigError(
            f"{where}: that run is on lattice.shape={list(shape)}, this one on "
            f"{list(config.lattice.shape)}, and {first_line(err)}"
        ) from None


def model_differences(record: results.RunRecord, config: Config) -> str:
    """Returns the model keys whose values differ between ``record``'s run and ``config``."""
    earlier = (stored_config(record) or {}).get("model", {})
    if not isinstance(earlier, dict):
        return ""
    now = dataclasses.asdict(config.model)
    free = keys_with("free_across_init")
    differ = [
        f"model.{key}={now[key]} here, {earlier[key]} there"
        for key in now
        if key in earlier and earlier[key] != now[key] and f"model.{key}" not in free
    ]
    return "; ".join(differ)


# The checkpoint's top level, and what each entry must be: a results file is data that
# anyone may have written, so its shape is checked before any of it is used.
CHECKPOINT_ENTRIES = {
    "model": dict,
    "vmc": dict,
    "sampler": dict,
    "torch_rng": torch.Tensor,
    "seconds": float,
}


def checked_state(state: dict, where: str) -> dict:
    """Returns the checkpoint dict ``state`` when its entries have the types a checkpoint
    of ours has; ConfigError naming ``where`` otherwise."""
    for key, kind in CHECKPOINT_ENTRIES.items():
        value = state.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if not isinstance(value, kind):
            raise ConfigError(
                f"{where}: the checkpoint's '{key}' is {type(value).__name__}, not "
                f"{kind.__name__}; the file is not a vitqs checkpoint"
            )
    if not all(isinstance(v, torch.Tensor) for v in state["model"].values()):
        raise ConfigError(f"{where}: the checkpoint's model parameters are not all tensors")
    return state


def checkpoint_parameters(record: results.RunRecord) -> dict:
    """Returns the model parameters of ``record``'s checkpoint (a sweep's warm start)."""
    return checked_state(results.load_checkpoint(record), f"'{record.name}'")["model"]


def state_of(vmc, seconds: float) -> dict:
    """Returns the checkpoint of a `VMC` loop after ``seconds`` of the run: one dict of the
    model's parameters, the loop's state, the sampler's (a collective: every rank calls it,
    the sampler gathers all chains), torch's generator and the seconds."""
    return {
        "model": vmc.model.state_dict(),
        "vmc": vmc.state_dict(),
        "sampler": vmc.sampler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "seconds": seconds,
    }


def load_state(state: dict, where: str, vmc) -> float:
    """Loads a checkpoint into a `VMC` loop (model, loop state, sampler) and torch's
    generator; returns its seconds. Whatever does not fit is a ConfigError naming ``where``,
    not a traceback."""
    state = checked_state(state, where)
    try:
        vmc.model.load_state_dict(state["model"])
        vmc.load_state_dict(state["vmc"])
        vmc.sampler.load_state_dict(state["sampler"])
        torch.set_rng_state(state["torch_rng"])
    except (RuntimeError, TypeError, ValueError, KeyError, IndexError) as err:
        raise ConfigError(
            f"{where}: the checkpoint does not fit this run ({first_line(err)})"
        ) from None
    return float(state["seconds"])


def stored_config(record: results.RunRecord) -> dict | None:
    """Returns the config a results file says it ran, parsed like a config file, in
    today's keys (`config.upgrade_stored`: an older file's schedules)."""
    try:
        data = parse_yaml(record.config_yaml)
    except (ConfigError, yaml.YAMLError, RecursionError):
        raise ConfigError(f"run {record.name!r}: its stored config is not valid YAML") from None
    return upgrade_stored(data) if isinstance(data, dict) else None


def _flatten(data, prefix=""):
    if not isinstance(data, dict):
        return {prefix.rstrip("."): data}
    flat = {}
    for key, value in data.items():
        flat.update(_flatten(value, f"{prefix}{key}."))
    return flat


def config_changes(record: results.RunRecord, config: Config, *, ignoring=None) -> list[str]:
    """Returns the dotted keys whose values differ between ``record``'s run and ``config``,
    leaving out those in ``ignoring`` (default: those a resume may change, `keys_with`)."""
    return changed_keys(stored_config(record) or {}, config.to_dict(), ignoring)


def changed_keys(old: dict, new: dict, ignoring=None) -> list[str]:
    """Returns the dotted keys whose value differs between two configs, but for
    ``ignoring`` (the resumable keys by default). A key the old config lacks (a file written
    before the key existed) counts as holding its default, which keeps the behaviour the
    code had before it; a key the new one lacks (retired since) its off value."""
    ignoring = keys_with("resumable") if ignoring is None else ignoring
    old, new = _flatten(old), _flatten(new)
    defaults = key_defaults()
    keys = sorted(set(old) | set(new))
    return [
        k
        for k in keys
        if old.get(k, defaults.get(k)) != new.get(k, defaults.get(k)) and k not in ignoring
    ]
