"""Profiles and grids: what a table notebook runs, as plain data from params/<name>.yaml.

A params file looks like

    profile: mini                 # smoke | mini | paper
    profiles:
      mini:
        seeds: [0, 1]
        base:     {dataset: fmnist, model: cnn_cifar10, ...}   # common run settings
        settings: {"20 clients": {n_clients: 20}, ...}          # table columns/rows (a setting's
                                                                 # `methods: [..]` runs those methods only)
        methods:  {fedavg: {}, fedprox: {hparams: {mu: 0.001}}} # method -> overrides

and each run is base <- per_dataset[dataset]["*"] <- setting <- method <- per_dataset[dataset][method]
<- setting.per_method[method] <- {algorithm, seed} <- the command line's run settings (`key=value` of `train`,
`cost` and `tune`: `grid`'s `overrides`, whose `seeds=[..]` replaces the seeds). A method entry may name its
`algorithm` (for variants of one algorithm); by default the method name is the algorithm. `per_dataset` holds the
paper's per-dataset choices (e.g. FedProx's mu, FedPer's head) once, for every table. `load_profile`'s `overrides`
(same shape as a profile) is merged on top, which is how papermill sweeps set one value.

A file may `inherit: <other>`: its profiles start from the other file's (`base`, `per_dataset`
and `extra` merge key by key; `seeds`, `settings` and `methods` are replaced whole). A file
with `source: <other>` and no profiles of its own renders another table's runs (e.g. Table 5
from Table 2's): its profiles are the source's.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from ..federation.config import RunConfig
from ..params import ConfigError, did_you_mean
from ..paths import REPO_ROOT, results_root
from . import budget, executors, parallel
from .progress import GridLog, tqdm
from .store import is_finished, METRICS, OPTIONAL_METRICS, run, run_dir, RunResult

PROFILES = ("smoke", "mini", "paper")


def merge(base: dict, over: dict | None) -> dict:
    out = dict(base)
    for k, v in (over or {}).items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


PROFILE_KEYS = ("seeds", "base", "settings", "methods", "methods_extend", "per_dataset", "extra")
# keys a params file may hold beside `profiles`: which profile, where it inherits from, and what its notebook reads
FILE_KEYS = ("profile", "profiles", "inherit", "source", "paper_table", "paper_column", "metric", "gm_rows", "scale",
             "targets", "pairs", "methods_shown", "finetune_epochs", "bandwidth_mbps", "parallel_clients", "reference",
             "method", "alone")   # alone: its render stage runs it with no other notebook beside it (pipeline.notebooks)


def _unknown(what: str, key: str, allowed) -> ConfigError:
    return ConfigError(f"{what}: unknown key{did_you_mean(key, allowed)}; allowed: "
                       + ", ".join(allowed))
_WHOLE = ("seeds", "settings", "methods")  # replaced, not merged, by an inheriting file
# `methods_extend:` adds methods to the inherited (or own) `methods` instead of replacing them: {name: overrides}; a
# name the list already has gets these overrides merged into its own


def read_params(name: str, _seen: tuple = ()) -> dict:
    """params/<name>.yaml with `inherit:` / `source:` resolved into full profiles."""
    path = REPO_ROOT / "params" / f"{name}.yaml"
    if not path.exists():
        known = sorted(f.stem for f in (REPO_ROOT / "params").glob("*.yaml"))
        raise ConfigError(f"params/{name}.yaml does not exist{did_you_mean(name, known)}")
    if name in _seen:
        raise ConfigError(f"params/{name}.yaml: inherit/source cycle {' -> '.join(_seen + (name,))}")
    doc = yaml.safe_load(path.read_text()) or {}
    for key in doc:
        if key not in FILE_KEYS:   # a misspelt `profle: smoke` would otherwise be ignored and run the default
            raise _unknown(f"params/{name}.yaml: {key}", key, FILE_KEYS)
    parent_name = doc.get("inherit") or (doc.get("source") if "profiles" not in doc else None)
    if parent_name:
        parent = read_params(parent_name, _seen + (name,))
        profiles = {}
        for prof, par in parent.get("profiles", {}).items():
            own = (doc.get("profiles") or {}).get(prof, {})
            merged = merge({k: v for k, v in par.items() if k not in _WHOLE or k not in own},
                           {k: v for k, v in own.items() if k not in _WHOLE})
            merged.update({k: own[k] for k in _WHOLE if k in own})
            profiles[prof] = merged
        doc = {**{k: v for k, v in parent.items() if k not in ("profiles", "inherit", "source")},
               **doc, "profiles": profiles}
    doc["profiles"] = {prof: _extended(p, f"params/{name}.yaml:{prof}") if isinstance(p, dict) else p
                       for prof, p in (doc.get("profiles") or {}).items()}
    return doc


def _extended(p: dict, where: str) -> dict:
    """`methods` with `methods_extend` merged in (what an inheriting file adds to its parent's list)."""
    if "methods_extend" not in p:
        return p
    more = p["methods_extend"]
    if not isinstance(more, dict):
        raise ConfigError(f"{where}.methods_extend={more!r}: expected a mapping method -> overrides")
    methods = dict(p.get("methods") or {})
    for m, over in more.items():
        methods[m] = merge(methods.get(m) or {}, over or {}) if m in methods else (over or {})
    return {**{k: v for k, v in p.items() if k != "methods_extend"}, "methods": methods}


def default_profile(name: str) -> str:
    """The profile params/<name>.yaml names (`profile:`, else mini): what `dvc repro` renders."""
    return read_params(name).get("profile", "mini")


def load_profile(name: str, profile: str | None = None, overrides: dict | None = None) -> dict:
    """Read params/<name>.yaml and return the chosen profile, with overrides merged."""
    doc = read_params(name)
    profile = profile or doc.get("profile", "mini")
    if profile not in doc.get("profiles", {}):
        raise ConfigError(f"profile={profile!r}{did_you_mean(profile, doc.get('profiles', {}))}: params/{name}.yaml "
                          f"defines {', '.join(doc.get('profiles', {}))}")
    p = _extended(merge(doc["profiles"][profile], overrides), f"params/{name}.yaml:{profile}")
    unknown = set(p) - set(PROFILE_KEYS)
    for k, v in doc.items():  # file-level keys (paper_table, metric, ...) apply to every profile
        if k not in ("profile", "profiles"):
            p.setdefault(k, v)
    if unknown:
        key = sorted(unknown)[0]
        raise _unknown(f"params/{name}.yaml:{profile}.{key}", key, PROFILE_KEYS)
    metric = p.get("metric", "pm_acc_mean")
    if metric not in METRICS + OPTIONAL_METRICS:   # else a KeyError after every run has trained
        raise _unknown(f"params/{name}.yaml: metric={metric!r}", metric, METRICS + OPTIONAL_METRICS)
    for k in ("seeds", "base", "methods"):
        if k not in p:
            raise ConfigError(f"params/{name}.yaml:{profile}: missing `{k}`")
    p["profile"] = profile
    p["name"] = name
    return p


def merge_run(base: dict, over: dict | None) -> dict:
    """`merge` for run settings: a layer that switches `partition` (or `split`) starts its
    `partition_params` (`split_params`) afresh instead of inheriting the other rule's."""
    over = over or {}
    for rule in ("partition", "split"):
        if rule in over and over[rule] != base.get(rule):
            base = {k: v for k, v in base.items() if k != f"{rule}_params"}
    return merge(base, over)


def run_overrides(p: dict, overrides: dict | None) -> tuple[list, dict]:
    """(the seeds to run, the run-setting layer) of command-line `overrides` on profile `p`: `seeds=[..]` replaces
    the profile's seeds (a non-empty list of ints >= 0); every other key is a run setting (checked by
    RunConfig.from_dict in `grid`). `seed` and `algorithm` are refused: a grid's seeds and methods set them."""
    layer = dict(overrides or {})
    where = f"[{p['name']}/{p['profile']}]"
    for key, instead in (("seed", "seeds=[...] replaces the profile's seeds"),
                         ("algorithm", "each method of the grid names its algorithm")):
        if key in layer:
            raise ConfigError(f"{where} {key}={layer[key]!r}: not an override of a grid; {instead}")
    if "seeds" not in layer:
        return p["seeds"], layer
    seeds = layer.pop("seeds")
    if not (isinstance(seeds, list) and seeds
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise ConfigError(f"{where} seeds={seeds!r}: expected a non-empty list of integers >= 0, e.g. seeds=[0,1]")
    return seeds, layer


def grid(p: dict, overrides: dict | None = None) -> dict:
    """{(method, setting, seed): RunConfig}, every config validated before anything runs.

    `overrides` (the command line's `key=value`s, nested: {"hparams": {"mu": 0.1}}) is the last layer of every run;
    its `seeds` replaces the profile's (run_overrides). An hparams key suits only grids whose algorithms all have it:
    the others' configs are refused, naming the method."""
    seeds, last = run_overrides(p, overrides)
    out = {}
    for setting, s_over in (p.get("settings") or {"default": {}}).items():
        s_over = dict(s_over or {})
        per_method = s_over.pop("per_method", {})  # e.g. FedProx's mu per dataset
        only = s_over.pop("methods", None)           # a setting that runs some of the methods only (a sweep's axis)
        unknown = sorted(set(only or ()) - set(p["methods"]))
        if unknown:
            raise ConfigError(f"[{p['name']}/{p['profile']}] setting={setting}: methods {unknown} are not in the "
                              f"profile's methods ({', '.join(p['methods'])})")
        for method, m_over in p["methods"].items():
            if only is not None and method not in only:
                continue
            m_over = dict(m_over or {})
            algorithm = m_over.pop("algorithm", method)
            for seed in seeds:
                ds = merge(merge(merge(p["base"], s_over), m_over), last).get("dataset")  # an override's too
                per_ds = (p.get("per_dataset") or {}).get(ds) or {}
                d = p["base"]
                for layer in (per_ds.get("*"), s_over, m_over, per_ds.get(method), per_method.get(method),
                              {"algorithm": algorithm, "seed": seed}, last):
                    d = merge_run(d, layer)
                try:
                    out[(method, setting, seed)] = RunConfig.from_dict(d)
                except ConfigError as e:
                    raise ConfigError(f"[{p['name']}/{p['profile']}] method={method} setting={setting}: {e}") from None
    return out


def run_grid(configs: dict, root: Path | str | None = None, progress: bool | str = True,
             jobs: int | str | None = None, name: str = "grid", executor=None,
             announce_cost: bool = False, keep_going: bool = True) -> dict[tuple, RunResult]:
    """Run (or load from the store) every config. Two keys naming the same config share one run.

    Missing runs train on `executor` (pflrepro.pipeline.executors: None = $PFLREPRO_EXECUTOR or "local"), locally
    `jobs` at a time (pflrepro.pipeline.parallel: None = $PFLREPRO_JOBS or "auto"). Each is claimed first, so a second
    driver on the same store waits for it instead of training it again (executors.Claims). `announce_cost`:
    first print what the missing runs cost (pflrepro.pipeline.budget: FLOPs, time here and on a GPU), as for a paper profile.
    `keep_going`: a run that fails is named and the others train (their results stay stored); the failures are
    raised at the end (parallel.GridFailed); False: the first failure stops the grid.
    `progress`: True = tqdm bars (one over runs; with one local job each run also shows its own), False =
    nothing, "log" = plain lines to stderr for logs (`dvc repro`: runs done, rounds of the runs in
    flight, time left; pflrepro.pipeline.progress.GridLog, headed `[name]`)."""
    from contextlib import nullcontext

    if progress not in (True, False, "log"):
        raise ValueError(f"progress={progress!r}: True (bars), False (silent) or 'log' (plain lines for logs)")
    bars = progress is True
    paths = {key: run_dir(cfg, root) for key, cfg in configs.items()}
    todo = {}
    for key, cfg in configs.items():
        if not is_finished(paths[key]):
            todo.setdefault(paths[key], (key, cfg))
    ex = executors.resolve(executor, jobs, [c for _, c in todo.values()])
    if announce_cost and todo:
        cost = budget.grid_cost([c for _, c in todo.values()], jobs=getattr(ex, "jobs", None))
        print(budget.describe(cost, name), file=sys.__stderr__ or sys.stderr, flush=True)
    logging = progress == "log" and bool(todo)
    log = GridLog(name, {p: (f"{k[0]} / {k[1]} s{k[2]}", parallel.work(c)) for p, (k, c) in todo.items()},
                  total=len(set(paths.values())))
    with log if logging else nullcontext(), executors.Claims(todo) as claims:
        bar = tqdm(total=len(todo), desc=f"runs ({ex.describe()})", unit="run", disable=not bars or not todo)

        path_of = {id(c): p for p, (_, c) in todo.items()}

        def done(cfg):
            bar.update(1)
            if logging:
                log.done(path_of[id(cfg)])

        def train(ps):
            if ps:
                ex.train_all([todo[p][1] for p in ps], root, on_done=done, bars=bars, keep_going=keep_going)
        train(claims.mine)
        for p in claims.others:   # another driver holds it: wait until it lets go, train it if it died first
            claims.wait(p)
            if is_finished(p):
                done(todo[p][1])
            else:
                train([p])
        bar.close()
    return {key: run(cfg, root=root, progress=False) for key, cfg in configs.items()}


def output_dirs(name: str, out_dir: str | None) -> tuple[Path, Path, Path]:
    """(results dir, figures dir, run store) for a notebook; absolute, created.

    By default every notebook shares one content-addressed run store, `results/runs` (key =
    config + code fingerprint), so tables built from the same runs (Table 2 -> Tables 4, 5,
    Figs. 6, 7) never train twice ($PFLREPRO_RESULTS moves results/, as for `store.run`). A sweep
    point with its own `out_dir` keeps its runs there."""
    res = Path(out_dir) if out_dir else results_root() / name
    res = res if res.is_absolute() else REPO_ROOT / res
    fig = res / "figures" if out_dir else REPO_ROOT / "figures" / name
    store = res / "runs" if out_dir else results_root() / "runs"
    for d in (res, fig, store):
        d.mkdir(parents=True, exist_ok=True)
    return res, fig, store


def train_notebooks(names: list[str], profile: str | None = None, jobs: int | str | None = None,
                    progress: bool | str = "log", label: str = "train", executor=None,
                    overrides: dict | None = None, keep_going: bool = True) -> dict:
    """Train every run the notebooks `names` need (each at its params file's default profile, or `profile`),
    as one grid: runs shared between tables train once, and all of a paper's runs queue together, longest
    first, so `jobs` processes stay busy instead of waiting at the end of each notebook's short grid.
    `overrides` (run settings, `seeds`: `grid`) apply to every run; every grid is built and validated before any
    run trains. The notebooks then find every run stored and only render. Returns the manifest
    {"profile", "notebooks": {name: [run dirs]}}: run directory names are content addresses (config +
    code), so the manifest changes exactly when a notebook's runs do (a DVC dependency of its stage)."""
    configs, paper = {}, False
    for name in names:
        P = load_profile(name, profile)
        paper |= P["profile"] == "paper"
        for (method, setting, seed), cfg in grid(P, overrides).items():
            configs[(name, f"{name}: {method}", setting, seed)] = cfg
    done = run_grid({key[1:]: cfg for key, cfg in configs.items()}, root=results_root() / "runs",
                    progress=progress, jobs=jobs, name=label, executor=executor, announce_cost=paper,
                    keep_going=keep_going)
    dirs = {name: set() for name in names}
    for name, *key in configs:
        dirs[name].add(Path(done[tuple(key)].path).name)
    return {"profile": profile or "default", "notebooks": {n: sorted(d) for n, d in dirs.items()},
            **({"overrides": overrides} if overrides else {})}
