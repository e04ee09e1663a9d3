"""The tables and pictures README.md and docs/*.md show, generated from the files that hold the results
(benchmarks/results/, results/reference/, the Config's own code), never typed by hand: `workbook docs
tables` rewrites every generated block in place, `--check` names the stale ones (tests/test_doc_tables.py
runs it), and `workbook docs figures` draws the README's pictures from the same files.

A generated block in a page is

    <!-- generated: NAME (workbook docs tables) -->
    ... what GENERATORS[NAME]() returns ...
    <!-- end generated -->

NAME is a key of `GENERATORS`, or `benchmark:STEM` for the body of benchmarks/results/STEM.md (which the
benchmark script writes together with STEM.json, from the same measurements); STEM may name a folder of
results from another machine, e.g. `benchmark:amd-epyc-2-cores-no-gpu/speedrun_speedrun`; or `choice:FOLDER` for a
recipe choice's variants side by side (`choice_table`)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from course_lib import paths
from course_lib.analysis.reference import REFERENCE_FOLDER as REFERENCES
from course_lib.config import WorkbookError

BEGIN = re.compile(r"<!-- generated: (?P<name>[\w:./-]+) \(workbook docs tables\) -->\n")
END = "<!-- end generated -->"
RESULTS = Path("benchmarks") / "results"
IMAGES = Path("docs") / "images"
RACE_FIGURE = IMAGES / "race.png"
EXPLORER_FIGURE = IMAGES / "explorer-eurosat.png"


class DocTablesError(WorkbookError):
    """A page names a generated block that does not exist, or leaves one open; one line with the fix."""


def pages(root: Path | None = None) -> list[Path]:
    """The pages that may carry generated blocks: README.md and every docs/*.md."""
    root = Path(root or paths.project_root())
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _result_file(name: str, root: Path) -> Path:
    """benchmarks/results/NAME, or a one-line error saying what writes it."""
    path = root / RESULTS / name
    if not path.is_file():
        raise DocTablesError(f"{path} is missing: run the benchmark in benchmarks/ that writes it, or take its "
                             "block out of the page")
    return path


def _results(stem: str, root: Path) -> dict:
    return json.loads(_result_file(f"{stem}.json", root).read_text())


def _interval(stat: dict, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    """`98.43% [98.23, 98.63]`; one seed (no interval): the mean alone."""
    if stat.get("low") is None:
        return f"{stat['mean'] * scale:.{digits}f}{unit}"
    return (f"{stat['mean'] * scale:.{digits}f}{unit} [{stat['low'] * scale:.{digits}f}, "
            f"{stat['high'] * scale:.{digits}f}]")


def _where(run: dict) -> str:
    """Where a results file's run was measured: `hardware, load 0.5-2.0, 2026-12-04 09:48`."""
    return (f"{run['hardware']}, load {run['load_average_before']:.1f}-{run['load_average_after']:.1f}, "
            f"{run['started']}")


def _race(stem: str, root: Path) -> tuple[dict, str]:
    """A bench_speedrun or bench_race result scored on EuroSAT's valid split, and the split as the headline names it; a run
    scored elsewhere (a carve-out of train, the sample) is a one-line error: the headline reports held-out runs."""
    from course_lib.engine.speedrun import VALID_SPLIT

    run = _results(stem, root)
    if run.get("split") != VALID_SPLIT:
        raise DocTablesError(f"{RESULTS / stem}.json was scored on {run.get('split')!r}, not on {VALID_SPLIT!r}: "
                             "rerun benchmarks/bench_speedrun.py with the real data and without "
                             "`--validation-from train` before the headline reports it")
    runs = run["summary"]["runs"] if "summary" in run else len(run["seeds"]) // len(run["recipes"])  # bench_race's: each
    return run, f"EuroSAT `valid` ({runs} seeds, mean [95% interval]; no choice made on it, tuned on a carve-out of `train`)"


def headline_table(root: Path | None = None) -> str:
    """The README's short table of headline results: what, measured value, hardware and load, and the split
    it was scored on, read from benchmarks/results/*.json and the committed reference results. Every accuracy
    here is a mean over seeds with its interval, TTA apart (a one-seed figure stays on its own page with that
    caveat)."""
    root = Path(root or paths.project_root())
    rows = []
    run, split = _race("speedrun_speedrun", root)
    summary = run["summary"]
    rows.append((f"speed-run recipe: top-1, single view; {summary['tta_views']}-view TTA",
                 f"{_interval(summary['top1'], 100, unit='%')}; {_interval(summary['top1_tta'], 100, unit='%')}",
                 _where(run), split))
    to_target = (f"{_interval(summary['seconds_to_target'], digits=0)} s (reached by {summary['reached_target']} of "
                 f"{summary['runs']}); " if summary.get("seconds_to_target") else "not reached; ")
    rows.append((f"speed-run recipe: seconds to {summary['target']:.0%} single view; whole run (decoding included)",
                 to_target + f"{_interval(summary['seconds'], digits=0)} s", _where(run), split))
    best, split = _race("speedrun_best", root)
    summary, config = best["summary"], best["config"]
    rows.append((f"best recipe, from scratch ({config['epochs']} epochs at {config['image_size']} px): top-1, single "
                 f"view; {summary['tta_views']}-view TTA; seconds a seed",
                 f"{_interval(summary['top1'], 100, unit='%')}; {_interval(summary['top1_tta'], 100, unit='%')}; "
                 f"{_interval(summary['seconds'], digits=0)} s", _where(best), split))
    rows.append(_race_pair_row(root))
    data = _results("engine_data", root)
    by_setting = {(r["storage"], r["decoder"], r["augmentation"], r["num_workers"]): r for r in data["rows"]}
    files, cache = by_setting.get(("files", "pil", "cpu", 1)), by_setting.get(("cache", "pil", "device", 1))
    if files and cache:
        rows.append(("engine images/s, pre-decoded cache + device augmentation vs JPEG files",
                     f"{cache['images_per_second'] / files['images_per_second']:.2f}x "
                     f"({cache['images_per_second']:.0f} vs {files['images_per_second']:.0f} images/s, "
                     f"{data['parameters'].get('model', 'resnet18')})",
                     _where(data),
                     "EuroSAT `train` (speed, not accuracy)"))
    rows.append(_imagenette_row(root))
    from course_lib.analysis import claims

    counts = claims.accuracy_counts(whose="reference", root=root / REFERENCES)
    conclusive = sum(count[claims.CONCLUSIVE] for count in counts.values())
    total = sum(count["total"] for count in counts.values())
    machines = sorted(p.name for p in (root / REFERENCES).iterdir() if p.is_dir()) if (root / REFERENCES).is_dir() else []
    per_notebook = ", ".join(f"{notebook}: {count[claims.CONCLUSIVE]} of {count['total']}"
                             for notebook, count in counts.items())
    demonstrated = claims.demonstrations(root / REFERENCES)
    rows.append(("accuracy verdicts of the reference runs that are conclusive (holds or refuted, by rules stated "
                 "before the run)",
                 f"{conclusive} of {total} ({per_notebook}); apart from these, {demonstrated} "
                 f"{claims.DEMONSTRATED}",
                 ", ".join(machines) or "no reference committed", f"EuroSAT `valid`{_reference_profiles(root)}"))
    lines = ["| result | measured | hardware | scored on |", "|---|---|---|---|"]
    lines += [f"| {what} | {value} | {hardware} | {split} |" for what, value, hardware, split in rows]
    return "\n".join(lines)


def _race_pair_row(root: Path, stem: str = "race_speedrun_vs_speedrun2") -> tuple[str, str, str, str]:
    """The headline's speedrun2 row: bench_race.py's race against the speed-run on valid (the newest, of any machine)."""
    found = sorted((root / RESULTS).rglob(f"{stem}.json"), key=lambda path: json.loads(path.read_text())["started"])
    if not found:
        raise DocTablesError(f"{RESULTS / stem}.json is missing: run benchmarks/bench_race.py --recipes speedrun,speedrun2")
    run, split = _race(str(found[-1].relative_to(root / RESULTS).with_suffix("")), root)
    ratio, change, summaries = run["speedup"], run["top1_change"], run["summaries"]
    seconds = "; ".join(f"{_interval(summaries[name]['seconds_to_target'] or {'mean': float('nan')}, digits=0)} s ({name}, "
                        f"reached by {summaries[name]['reached_target']} of {summaries[name]['runs']})" for name in run["recipes"])
    return ("speedrun2 raced against the speed-run side by side (seed by seed, in turn): speed-up to 97% single view; "
            "seconds to 97%; final top-1 single view, speedrun2 minus speedrun",
            (f"{ratio['ratio']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}] ({ratio['pairs']} seeds)" if ratio else "-")
            + f"; {seconds}; " + (f"{change['delta']:+.2f} points [{change['low']:+.2f}, {change['high']:+.2f}]"
                                  if change else "-"), _where(run), split)


def _imagenette_row(root: Path) -> tuple[str, str, str, str]:
    """The headline's Imagenette row: benchmarks/bench_imagenette.py's result when it ran on Imagenette (top-1 and
    top-5 on the official val, the gap to the leaderboard), else what it takes to measure it."""
    from course_lib.analysis import imagenette

    what = f"imagenette recipe against fast.ai's leaderboard ({imagenette.leaderboard_line()})"
    path = root / RESULTS / f"{imagenette.RESULT_STEM}.json"
    run = json.loads(path.read_text()) if path.is_file() else {}
    if not run.get("on_imagenette"):
        return (what, "not measured yet: no run on Imagenette committed", "-",
                f"Imagenette's official val, after `{paths.GET_IMAGENETTE}` and benchmarks/bench_imagenette.py "
                "(5 runs of a ResNet-50: a GPU's job)")
    summary, gap, config = run["summary"], run["gap"], run["config"]
    shift = f" [{gap['low']:+.2f}, {gap['high']:+.2f}]" if gap.get("low") is not None else ""
    return (what, f"top-1 {_interval(summary['test_top1'], 100, unit='%')}; top-5 "
                  f"{_interval(summary['test_top5'], 100, unit='%')}; {gap['points']:+.2f} points{shift} from it",
            _where(run), f"Imagenette's official val ({summary['runs']} runs, mean [95% interval]; "
                         f"{config['image_size']} px, {config['epochs']} epochs; tuned on `valid`)")


def benchmark_body(stem: str, root: Path | None = None) -> str:
    """benchmarks/results/STEM.md without its title line: what the benchmark wrote with STEM.json."""
    lines = _result_file(f"{stem}.md", Path(root or paths.project_root())).read_text().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).strip("\n")


def choice_table(folder: str, root: Path | None = None) -> str:
    """One row per variant of a recipe choice: benchmarks/results/FOLDER/<variant>/speedrun_*.json (`bench_speedrun.py
    --out`, usually `--validation-from train`). Columns: the variant's folder, the values that differ between them (a
    field a run predates reads as its default, which kept the old behaviour), split, top-1 1 view and TTA, seconds, hardware."""
    from course_lib.config import Config

    root = Path(root or paths.project_root())
    files = sorted((root / RESULTS / folder).glob("*/speedrun_*.json"))
    if not files:
        raise DocTablesError(f"{root / RESULTS / folder} holds no <variant>/speedrun_*.json: run `benchmarks/bench_speedrun.py "
                             f"--out {RESULTS / folder}/<variant>` for each variant, or take the block out of the page")
    runs = [(path.parent.name, json.loads(path.read_text())) for path in files]
    configs = [{**Config().to_dict(), **run["config"]} for _, run in runs]
    differing = [name for name in sorted(configs[0]) if len({str(config.get(name)) for config in configs}) > 1
                 and name not in ("output_dir", "seed", "run_name")]
    lines = ["| variant | " + " | ".join(differing) + " | scored on | seeds | top-1, 1 view | top-1, TTA | seconds | "
             "hardware, load |", "|---" * (len(differing) + 7) + "|"]
    for (variant, run), config in zip(runs, configs):
        summary = run["summary"]
        lines.append(f"| {variant} | " + " | ".join(str(config.get(name)) for name in differing) +
                     f" | {run['split']} | {summary['runs']} | {_interval(summary['top1'], 100, unit='%')} | "
                     f"{_interval(summary['top1_tta'], 100, unit='%')} ({summary['tta_views']} views) | "
                     f"{_interval(summary['seconds'], digits=0)} | {_where(run)} |")
    return "\n".join(lines)


def _configuration(root: Path) -> str:
    from course_lib.config import configuration_table

    return configuration_table()


def _reference_profiles(root: Path) -> str:
    """Which profile each committed reference ran in: ", the committed references (cpu profile: 03, 06 ...;
    reference profile: 07)", or "" when none is committed."""
    from course_lib.analysis import reference

    by_profile: dict[str, set] = {}
    for item in reference.load_all(sorted((root / REFERENCES).glob("*/*.json"))):
        by_profile.setdefault(item.profile, set()).add(item.notebook)
    runs = "; ".join(f"{profile} profile: {', '.join(sorted(notebooks))}" for profile, notebooks in sorted(by_profile.items()))
    return f", the committed references ({runs})" if runs else ""


def _reference_counts(root: Path) -> str:
    from course_lib.analysis import claims

    return claims.accuracy_counts_table(claims.accuracy_counts(whose="reference", root=root / REFERENCES))


def _reference_accuracy(root: Path) -> str:
    from course_lib.analysis import claims

    return claims.accuracy_results_table(root=root / REFERENCES)


GENERATORS = {
    "configuration": _configuration,
    "headline": headline_table,
    "reference-counts": _reference_counts,
    "reference-accuracy": _reference_accuracy,
}


def render(name: str, root: Path | None = None) -> str:
    """What the block NAME holds today, from the files under `root`."""
    root = Path(root or paths.project_root())
    if name.startswith("benchmark:"):
        return benchmark_body(name.split(":", 1)[1], root)
    if name.startswith("choice:"):
        return choice_table(name.split(":", 1)[1], root)
    if name not in GENERATORS:
        raise DocTablesError(f"no generated table is called {name!r}; the names are {', '.join(GENERATORS)}, "
                             "benchmark:STEM (benchmarks/results/STEM.md) and choice:FOLDER (one row per "
                             "benchmarks/results/FOLDER/<variant>/speedrun_*.json)")
    return GENERATORS[name](root)


def refresh(text: str, root: Path | None = None, page: str = "page") -> tuple[str, list[str]]:
    """`text` with every generated block rewritten, and the names of the blocks that changed."""
    out, stale, position = [], [], 0
    for match in BEGIN.finditer(text):
        if match.start() < position:
            continue  # a marker inside a block already rewritten
        end = text.find(END, match.end())
        if end < 0:
            raise DocTablesError(f"{page}: the generated block {match['name']!r} has no '{END}' line; add it after "
                                 "the table")
        fresh = render(match["name"], root).rstrip("\n") + "\n"
        if text[match.end():end] != fresh:
            stale.append(match["name"])
        out += [text[position:match.end()], fresh]
        position = end
    out.append(text[position:])
    return "".join(out), stale


def update(root: Path | None = None, check: bool = False) -> list[str]:
    """Rewrite every page's generated blocks (or, with `check`, only compare); return "page: block" for each
    block that was (or would be) changed."""
    root = Path(root or paths.project_root())
    changed = []
    for page in pages(root):
        if not page.is_file():
            continue
        text = page.read_text()
        fresh, stale = refresh(text, root, page.relative_to(root).as_posix())
        changed += [f"{page.relative_to(root).as_posix()}: {name}" for name in stale]
        if stale and not check:
            page.write_text(fresh)
    return changed


def block_names(root: Path | None = None) -> dict[str, list[str]]:
    """Which generated blocks each page carries, page by page."""
    root = Path(root or paths.project_root())
    return {page.relative_to(root).as_posix(): [m["name"] for m in BEGIN.finditer(page.read_text())]
            for page in pages(root) if page.is_file()}


def race_figure(out: Path, results: Path | None = None):
    """Top-1 (single view) against seconds for every seed of the committed speed-run benchmark, with its
    target and the seconds by which it should be reached: the README's race picture. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = json.loads(Path(results or paths.project_root() / RESULTS / "speedrun_speedrun.json").read_text())
    figure, axes = plt.subplots(figsize=(7, 3.6), dpi=110)
    for seed in run["seeds"]:
        curve = seed["curve"]
        seconds = [point["seconds"] for point in curve]
        top1 = [100 * point["val_top1"] for point in curve]  # the race's curve is single-view
        axes.plot(seconds, top1, marker=".", linewidth=1.2, label=f"seed {seed['seed']}")
    target = 100 * run["summary"]["target"]
    axes.axhline(target, color="grey", linestyle="--", linewidth=1)
    axes.axvline(150, color="grey", linestyle=":", linewidth=1)
    axes.text(146, 62, "150 s: the target", color="grey", fontsize=8, rotation=90)
    axes.text(2, target + 0.6, f"{target:.0f}%", color="grey", fontsize=8)
    axes.set_ylim(50, 100)
    axes.set_xlim(0, max(160, max(s["seconds"] for s in run["seeds"]) + 10))
    axes.set_xlabel("seconds since the start, decoding included")
    axes.set_ylabel("validation top-1, single view (%)")
    axes.set_title(f"speed-run recipe on EuroSAT valid, {len(run['seeds'])} seeds: {run['hardware']}", fontsize=9)
    axes.legend(fontsize=7, loc="lower center", ncol=5)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)
    return figure


def explorer_figure(evaluation_path: Path, out: Path) -> Path:
    """The confusion explorer's static picture (`ConfusionExplorer.picture_png`, what a rendered notebook
    shows in place of the live widget) of a saved evaluation, written to `out`."""
    from course_lib.analysis import evaluation, explorer

    view = explorer.ConfusionExplorer([evaluation.Evaluation.load(evaluation_path)])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(view.picture_png())
    return out
