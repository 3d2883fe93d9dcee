"""The report's claims sections as markdown: the verdicts, what would decide the undecided ones, the forking-path
log."""
from __future__ import annotations

import yaml

from . import claims, verdicts


def _counts(rows: list[dict]) -> dict:
    c = {v: 0 for v in claims.VERDICTS}
    for r in rows:
        c[r["verdict"]] += 1
    return c


def _duration(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s:.1f} s" if s < 60 else (f"{s / 60:.1f} min" if s < 3600 else f"{s / 3600:.2f} h")


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _count_text(c: dict) -> str:
    return ", ".join(f"{n} {v}" for v, n in c.items() if n) or "none"


def claims_markdown(rows: list[dict]) -> str:
    """The paper's checklist, headline claims first: verdict, claim (id, stage, profile, flags), the quoted
    sentence, the reproduced effect with its interval, the same effect and verdict on the paper's own numbers,
    and the numbers that decided it."""
    out = [f"### Claims checklist: {_count_text(_counts(rows))}; independent tests decided: "
           f"{claims.independent_tests(rows)}\n"]
    table = []
    for r in sorted(rows, key=lambda r: not r.get("headline")):
        where = f"{'**headline** ' if r.get('headline') else ''}{r['id']}<br>`{r['stage']}`" + \
            (f"<br>profile {r['profile']}" if r["profile"] else "") + "".join(f"<br>{f}" for f in claims._flags(r))
        ev = r["evidence"] + (f" — paper's own numbers: {r['paper_inconsistent']}" if r["paper_inconsistent"] else "") \
            + (f" — note: {r['note']}" if r["note"] else "")
        robust = f"{r['robust_verdict']}: {r['robust_interval']}" if r.get("robust_verdict") else "—"
        table.append([r["verdict"], where, r["quote"], r.get("interval", ""), robust, claims.paper_text(r), ev])
    out.append(_md_table(["verdict", "claim", "quote", f"effect [{verdicts.INTERVAL_NAME}]",
                          "on the last tenth of the rounds", "on the paper's numbers", "numbers that decided it"], table))
    return "\n".join(out)


def decide_markdown(rows: list[dict]) -> str:
    """'What would decide the undecided headline claims': each one's per-seed spread of its main effect, the effect
    this profile's seeds detect with 80 % power (the main comparison, at its level), the paper's own effect beyond the
    claim's boundary, the paired seeds at which the whole claim would hold with 80 % power (`claims.seeds_needed`) and
    their CPU time here (`claims.what_would_decide`)."""
    undecided = [r for r in rows if "decide_seeds" in r]
    if not undecided:
        return ""
    fmt = claims._fmt

    def seeds(r):
        n = r["decide_seeds"]
        return (r["decide_note"] if r.get("decide_note") else
                "none: the paper's own effect is not beyond the boundary" if r.get("paper_gap") is not None
                and not r["paper_gap"] > 0 else "unknown (no per-seed spread, or no paper effect)" if n is None
                else f"more than {claims.MAX_SEEDS}" if n > claims.MAX_SEEDS else str(n))
    table = [[r["id"], r["verdict"], r["seeds"], fmt(r["seed_sd"]) if r.get("seed_sd") is not None else "—",
              fmt(r["mde"]) if r.get("mde") is not None else "—",
              fmt(r["paper_gap"]) if r.get("paper_gap") is not None else "—", seeds(r),
              _duration(3600 * r["decide_cpu_hours"]) if r.get("decide_cpu_hours") else "—",
              _duration(r["decide_gpu_s"]) if r.get("decide_gpu_s") else "—", _paper_scale(r.get("paper_scale"))]
             for r in undecided]
    leases = sorted({r["paper_scale"]["lease"] for r in undecided if r.get("paper_scale")})
    return ("### What would decide the undecided headline claims\n\n"
            "Per claim: its main effect's spread over the paired seeds, the effect these seeds detect with 80 % power "
            "(the main comparison, one-sided at its level), the paper's own effect beyond the claim's boundary (on its "
            "printed numbers), the paired seeds at which the whole claim (every comparison and cell it needs, at their "
            "levels) would hold with 80 % power were the paper's effects true at these spreads, and the CPU time of "
            "the seeds still to run (the measured wall time of the runs it read, per seed, on this machine). On a GPU: "
            "the same seeds' training FLOPs at the rate the device check measured on mini's workload; at the paper's "
            "scale: the claim's methods in every setting of the stage's paper profile, three seeds, at the rate it "
            "measured on a paper-scale small CNN (B = 64; a larger model uses a GPU better, so an upper bound there)"
            + (f" (H200 lease {', '.join(leases)}: `pflrepro.reporting.claims.scale`)" if leases else "")
            + ". Planning from the spreads seen, never a verdict.\n\n"
            + _md_table(["claim", "verdict", "seeds", "per-seed sd", "detectable now", "paper's effect",
                         "seeds to detect it", "CPU time for them", "on a GPU", "at the paper's scale"], table))


def _paper_scale(ps: dict | None) -> str:
    if not ps:
        return "—"
    h = ps["gpu_s"] / 3600
    return f"{ps['tflops']:,.0f} TFLOPs: " + (_duration(ps["gpu_s"]) if h < 100 else f"{h:,.0f} h") + " GPU"


FORKING_PATHS = claims.CLAIMS_DIR / "forking_paths.yaml"


def forking_paths(paper: str) -> list[dict]:
    """The paper's entries of the forking-path log (`paper_numbers/forking_paths.yaml`): mini settings chosen or
    changed after results were seen, and those of every paper (`paper: all`: the decision rule)."""
    if not FORKING_PATHS.exists():
        return []
    doc = yaml.safe_load(FORKING_PATHS.read_text()) or []
    entries = doc.get("entries", []) if isinstance(doc, dict) else doc
    return [e for e in entries if isinstance(e, dict) and e.get("paper") in (paper, "all")]


def forking_markdown(paper: str) -> str:
    entries = forking_paths(paper)
    if not entries:
        return ""
    cols = ("date", "setting", "before", "after", "seen", "reason", "verdicts_before", "verdicts_after")
    return (f"**Forking paths** ({len(entries)}: settings of this paper's profiles chosen or changed after results "
            "were seen; `paper_numbers/forking_paths.yaml`):\n\n"
            + _md_table([c.replace("_", " ") for c in cols], [[e.get(c, "") for c in cols] for e in entries]))


