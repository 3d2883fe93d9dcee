"""Where each setting of a run comes from: `python -m pflrepro explain NOTEBOOK [METHOD] [SETTING]` (as
`git config --show-origin`).

A run's config is built in layers (`experiments.grid`), each overriding the one before: the settings' defaults
(`settings.RUN_SCHEMA`), the `base:` of every params file of the notebook's `inherit:` chain from the furthest
ancestor to the notebook's own file, `per_dataset: {'*': ...}`, the setting (`settings:`), the method
(`methods:` / `methods_extend:`), `per_dataset: {<dataset>: {<method>: ...}}`, the setting's `per_method:`, the grid's
own `algorithm` and `seed`, and the command line's `key=value`s; a layer that switches `partition` (or `split`) starts
its `*_params` afresh (`experiments.merge_run`). What no layer sets is the default of its schema: the run's
(settings.py), the algorithm's `HPARAMS`, the partitioner's or split's schema, the clock's or the schedule's. This module
replays the same layers with an origin beside every value, and checks its answer against the config `grid` builds.
"""
from __future__ import annotations

import yaml

from .. import algorithms
from ..federation.config import RunConfig
from ..params import ConfigError
from ..paths import REPO_ROOT
from . import experiments
from .notebooks import params_chain


def _own(name: str, profile: str) -> dict:
    doc = yaml.safe_load((REPO_ROOT / "params" / f"{name}.yaml").read_text()) or {}
    return (doc.get("profiles") or {}).get(profile) or {}


def _nearest(chain: list[str], profile: str, *path) -> str:
    """The file nearest the notebook whose own profile sets `path` (e.g. ('methods', 'fedprox'))."""
    for name in reversed(chain):
        d = _own(name, profile)
        for k in path:
            d = d.get(k) if isinstance(d, dict) else None
        if d is not None:
            return f"params/{name}.yaml"
    return f"params/{chain[-1]}.yaml"


def layers(name: str, method: str, setting: str, profile: str | None = None,
           overrides: dict | None = None, p: dict | None = None) -> list[tuple[str, dict, bool]]:
    """(origin, settings, a grid layer) of every layer of one run, first to last: the base of every file of the chain
    (`read_params` merges them in this order, plainly), then the grid's layers (`experiments.grid`, by `merge_run`).
    `p`: the profile, when the caller has loaded it."""
    p = p or experiments.load_profile(name, profile)
    prof, chain = p["profile"], params_chain(name)[::-1]   # furthest ancestor first
    settings = p.get("settings") or {"default": {}}
    if setting not in settings:
        raise ConfigError(f"setting {setting!r}: params/{name}.yaml:{prof} has {', '.join(map(repr, settings))}")
    if method not in p["methods"]:
        raise ConfigError(f"method {method!r}: params/{name}.yaml:{prof} has {', '.join(p['methods'])}")
    out = [(f"params/{f}.yaml: profiles.{prof}.base", _own(f, prof).get("base") or {}) for f in chain]
    files = len(out)
    seeds, last = experiments.run_overrides(p, overrides)
    s_over = dict(settings[setting] or {})
    per_method, _ = s_over.pop("per_method", {}), s_over.pop("methods", None)
    m_over = dict(p["methods"][method] or {})
    algorithm = m_over.pop("algorithm", method)
    ds = experiments.merge(experiments.merge(experiments.merge(p["base"], s_over), m_over), last).get("dataset")
    per_ds = (p.get("per_dataset") or {}).get(ds) or {}
    where_m = _nearest(chain, prof, "methods_extend", method) if any(
        method in (_own(f, prof).get("methods_extend") or {}) for f in chain) else _nearest(chain, prof, "methods")
    out += [(f"{_nearest(chain, prof, 'per_dataset')}: per_dataset.{ds}.'*'", per_ds.get("*") or {}),
            (f"{_nearest(chain, prof, 'settings')}: settings.{setting!r}", s_over),
            (f"{where_m}: methods.{method}", m_over),
            (f"{_nearest(chain, prof, 'per_dataset')}: per_dataset.{ds}.{method}", per_ds.get(method) or {}),
            (f"{_nearest(chain, prof, 'settings')}: settings.{setting!r}.per_method.{method}",
             per_method.get(method) or {}),
            ("the grid: the method's algorithm, the profile's first seed", {"algorithm": algorithm, "seed": seeds[0]}),
            ("the command line (key=value)", last)]
    return [(o, d, i >= files) for i, (o, d) in enumerate(out) if d]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def origins(name: str, method: str, setting: str, profile: str | None = None,
            overrides: dict | None = None, p: dict | None = None) -> list[tuple[str, object, str]]:
    """(key, value, origin) of every setting of the run (its first seed), nested keys dotted (`hparams.tau`)."""
    where: dict[str, str] = {}
    merged: dict = {}
    p = p or experiments.load_profile(name, profile)
    for origin, layer, of_grid in layers(name, method, setting, profile, overrides, p):
        for rule in ("partition", "split") if of_grid else ():   # merge_run: a switched rule starts its params afresh
            if rule in layer and layer[rule] != merged.get(rule):
                where = {k: o for k, o in where.items() if not k.startswith(f"{rule}_params.")}
        merged = experiments.merge_run(merged, layer) if of_grid else experiments.merge(merged, layer)
        where.update({k: origin for k in _flat(layer)})
    grid = experiments.grid(p, overrides)
    cfg = next((c for (m, s, _), c in grid.items() if m == method and s == setting), None)
    if cfg is None:
        raise ConfigError(f"method {method!r} does not run in setting {setting!r} of params/{name}.yaml:{p['profile']} "
                          "(the setting's `methods:` names the ones it runs)")
    if RunConfig.from_dict(merged) != cfg:    # the replay must build what the grid builds
        raise RuntimeError(f"explain: the layers of {name}/{method}/{setting} do not rebuild the grid's config")
    return [(k, v, where.get(k) or _default(k, cfg)) for k, v in sorted(_flat(cfg.to_dict()).items())]


def _default(key: str, cfg) -> str:
    """Which schema's default a key no layer sets has."""
    head, _, leaf = key.partition(".")
    if head == "hparams" and leaf:
        cls = algorithms.ALGORITHMS[cfg.algorithm]
        owner = next((c for c in cls.__mro__ if leaf in vars(c).get("HPARAMS", {})), cls)
        return f"default: {owner.__module__.replace('.', '/')}.py ({owner.__name__}.HPARAMS)"
    return "default: " + {"partition_params": "pflrepro/data/partition (PARTITION_SCHEMAS)",
                          "split_params": "pflrepro/data/partition (SPLIT_SCHEMAS)",
                          "clock": "pflrepro/core/clock.py (CLOCK_SCHEMA)",
                          "schedule": "pflrepro/core/schedule.py (SCHEDULE_SCHEMA)",
                          "public": "pflrepro/settings.py (PUBLIC_SCHEMA)"}.get(head, "pflrepro/settings.py (RUN_SCHEMA)")


def text(name: str, method: str | None = None, setting: str | None = None, profile: str | None = None,
         overrides: dict | None = None) -> str:
    """The `explain` verb's output: one line a setting, `key = value` and where it came from."""
    p = experiments.load_profile(name, profile)
    method = method or next(iter(p["methods"]))
    setting = setting or next(iter(p.get("settings") or {"default": {}}))
    rows = origins(name, method, setting, profile, overrides, p)
    width = max(len(f"{k} = {v!r}") for k, v, _ in rows)
    head = (f"# {name} ({p['profile']}), method {method}, setting {setting!r}: each setting and the layer it comes "
            f"from (later layers override earlier ones; pflrepro/pipeline/explain.py)")
    return "\n".join([head, *(f"{f'{k} = {v!r}':<{width}}  # {o}" for k, v, o in rows)])
