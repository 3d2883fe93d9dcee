"""The claims files: loading and validating `paper_numbers/<paper>_claims.yaml` (the forms, their fields and choices)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from ...params import did_you_mean
from .. import verdicts


REPO_ROOT = Path(__file__).resolve().parents[3]   # = paths.REPO_ROOT (not imported: no torch for a checklist)
CLAIMS_DIR = REPO_ROOT / "paper_numbers"   # read at call time (a test points it at a fake paper's files)
VERDICTS = verdicts.VERDICTS
DEFAULT_PAPER_SEEDS = 3
SMALL_TEST = 30          # a per-client test set under this many images is named beside the verdict
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
KEY_COLUMNS = ("dataset", "setting", "panel", "metric", "method")
# the columns of an accuracy table (`tables.compare`) that its `test_n` (effective test images) is behind
ACCURACY_COLUMNS = ("reproduced", "last10", "last_tenth")
ROBUST_COLUMN = "last_tenth"   # the metric-robustness reading: the mean over the last tenth of the evaluations


COMMON = {"id", "quote", "where", "form", "section", "column", "std", "select", "group_by", "quantifier",
          "aggregate", "better", "min_gap", "noise", "missing", "profiles", "paper_datasets", "paper_view",
          "note", "paper_inconsistent", "by_design", "headline"}
TOP = {"paper", "source", "min_gap", "paper_datasets", "planned_stages", "scale_notes", "claims", "paper_seeds"}
FORMS = {  # form -> (required fields, optional fields)
    "order": ({"a", "b"}, {"by"}),
    "order_all": ({"above", "below"}, {"pairs"}),
    "best": ({"a"}, {"among", "exclude"}),
    "trend": ({"direction"}, {"along", "order", "series", "steps"}),
    "ratio": (set(), {"num", "den", "value", "at_least", "at_most"}),
    "near": ({"quantity", "tolerance"}, {"a", "b", "target", "paper_column", "paper_std", "among", "exclude"}),
}
CHOICES = {"quantifier": ("all", "most", "any"), "aggregate": ("mean", "max"), "better": ("higher", "lower"),
           "noise": ("seeds", "none"), "missing": ("skip", "fails", "worst"), "pairs": ("all", "any"),
           "direction": ("increasing", "decreasing", "peak"), "steps": ("all", "ends"),
           "quantity": ("value", "diff", "ratio", "margin")}


class ClaimsError(ValueError):
    """A claims file that does not validate; the message names the file and the claim id."""


# ------------------------------------------------------------------ loading and validation
def claims_files() -> list[Path]:
    return sorted(CLAIMS_DIR.glob("*_claims.yaml"))


def load(path: Path | str) -> dict:
    """Read and validate one claims file: {paper, claims: [...], ...}. Any problem is one ClaimsError
    naming the file and the claim id."""
    path = Path(path)
    doc = yaml.load(path.read_text(), Loader=_LOADER) or {}
    where = path.name
    if not isinstance(doc, dict) or "paper" not in doc or not isinstance(doc.get("claims"), list):
        raise ClaimsError(f"{where}: needs top-level 'paper' and a list 'claims'")
    unknown = sorted(set(doc) - TOP)
    if unknown:
        raise ClaimsError(f"{where}: unknown top-level key(s) {', '.join(unknown)}{did_you_mean(unknown[0], TOP)} "
                          f"(allowed: {', '.join(sorted(TOP))})")
    if not isinstance(doc.get("min_gap", 1.0), (int, float)):
        raise ClaimsError(f"{where}: min_gap must be a number")
    notes = doc.get("scale_notes", {})   # profile -> why claims cannot show at that scale (the report prints it)
    if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
        raise ClaimsError(f"{where}: scale_notes must map a profile name to a text")
    seen = set()
    for i, c in enumerate(doc["claims"]):
        cid = c.get("id") if isinstance(c, dict) else None
        name = f"{where}: claim {cid!r}" if cid else f"{where}: claim #{i + 1}"
        if not isinstance(c, dict) or not cid:
            raise ClaimsError(f"{name}: needs an 'id'")
        if cid in seen:
            raise ClaimsError(f"{name}: duplicate id")
        seen.add(cid)
        _validate(c, name)
    return doc


def _validate(c: dict, name: str) -> None:
    form = c.get("form")
    if form not in FORMS:
        raise ClaimsError(f"{name}: unknown form {form!r}{did_you_mean(form, FORMS)} (forms: {', '.join(FORMS)})")
    required, optional = FORMS[form]
    missing = sorted(({"quote", "where"} | required) - set(c))
    if missing:
        raise ClaimsError(f"{name}: form {form!r} needs {', '.join(missing)}")
    unknown = sorted(set(c) - COMMON - required - optional)
    if unknown:
        raise ClaimsError(f"{name}: unknown field(s) {', '.join(unknown)}{did_you_mean(unknown[0], COMMON | required | optional)} "
                          f"for form {form!r}")
    if not isinstance(c["quote"], str) or len(c["quote"].split()) < 3:
        raise ClaimsError(f"{name}: 'quote' must be the sentence quoted from the paper")
    w = c["where"]
    if not isinstance(w, dict) or not isinstance(w.get("stage"), str) or set(w) - {"stage", "table"}:
        raise ClaimsError(f"{name}: 'where' must be {{stage: <stage name>, table: <csv stem>}}")
    for key, allowed in CHOICES.items():
        if key in c and c[key] not in allowed:
            raise ClaimsError(f"{name}: {key}={c[key]!r}{did_you_mean(c[key], allowed)}, allowed: {', '.join(allowed)}")
    for key in ("min_gap", "by", "at_least", "at_most", "target", "tolerance"):
        if key in c and not isinstance(c[key], (int, float)):
            raise ClaimsError(f"{name}: {key} must be a number, got {c[key]!r}")
    for key in ("group_by", "order", "profiles", "paper_datasets"):
        if key in c and not isinstance(c[key], list):
            raise ClaimsError(f"{name}: {key} must be a list")
    if "select" in c and not isinstance(c["select"], dict):
        raise ClaimsError(f"{name}: 'select' must be a mapping column -> value or list")
    for key in ("a", "b", "above", "below", "among", "exclude", "series", "num", "den", "value"):
        if key in c:
            for r in _as_list(c[key]):
                if not (isinstance(r, str) or (isinstance(r, dict) and r)):
                    raise ClaimsError(f"{name}: {key} must be a method name or a mapping of column filters")
    if form == "ratio":
        if ("value" in c) == ("num" in c or "den" in c) or ("num" in c) != ("den" in c):
            raise ClaimsError(f"{name}: form 'ratio' needs either num and den, or value")
        if "at_least" not in c and "at_most" not in c:
            raise ClaimsError(f"{name}: form 'ratio' needs at_least and/or at_most")
    if form == "near":
        q = c["quantity"]
        need = {"value": set(), "diff": {"a", "b", "target"}, "ratio": {"a", "b", "target"},
                "margin": {"a", "target"}}.get(q)
        if need is None:
            raise ClaimsError(f"{name}: quantity={q!r}{did_you_mean(q, CHOICES['quantity'])}, allowed: "
                              f"{', '.join(CHOICES['quantity'])}")
        if need - set(c):
            raise ClaimsError(f"{name}: near with quantity {q!r} needs {', '.join(sorted(need - set(c)))}")
    if form == "trend" and c["direction"] == "peak" and c.get("steps") == "ends":
        raise ClaimsError(f"{name}: a peak has no 'steps: ends' reading")
    if "by_design" in c and not (isinstance(c["by_design"], str) and c["by_design"].strip()):
        raise ClaimsError(f"{name}: by_design must say why the quantity is fixed by construction")
    if "headline" in c and not isinstance(c["headline"], bool):
        raise ClaimsError(f"{name}: headline must be true or false")
    if "paper_view" in c and not (c["paper_view"] is False or isinstance(c["paper_view"], dict)):
        raise ClaimsError(f"{name}: paper_view must be false or {{rename: {{...}}, select: {{...}}}}")


def used_keys(row: dict) -> dict:
    """{key: its fields}: the cells a claim read (its row's `uses`, each a JSON object of key columns, as `judge`
    writes them), parsed once for every reader (the runs behind a claim, its methods, the design rule's pairs)."""
    return {u: json.loads(u) for u in row.get("uses") or []}


def used_methods(row: dict) -> tuple:
    """The methods a claim read, sorted, each once (cells without a method column add none)."""
    return tuple(sorted({k["method"] for k in used_keys(row).values() if "method" in k}))


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]
