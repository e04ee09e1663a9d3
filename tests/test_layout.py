"""The package layout's import rules, read from the source (every import, function-level ones too):
leaves stay leaves, data knows nothing of training, analysis needs no training loop, and only
`__main__` reaches the command line."""
import ast
import importlib
import re
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "course_lib"
MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path) -> set[str]:
    """Every course_lib module `path` imports, at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("course_lib")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("course_lib"):
            # `from course_lib.data import datasets` imports course_lib.data.datasets
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists()
                          or (PACKAGE.parent / candidate.replace(".", "/")).is_dir() else node.module)
    return found


IMPORTS = {module_name(p): project_imports(p) for p in MODULES}

# (modules the rule is about, forbidden targets) as prefixes of dotted names.
RULES = [
    (("course_lib.config", "course_lib.paths"), ("course_lib",)),
    (("course_lib.data",), ("course_lib.engine", "course_lib.ledger", "course_lib.analysis", "course_lib.chapters",
                            "course_lib.deploy")),
    (("course_lib.models",), ("course_lib.engine", "course_lib.analysis", "course_lib.chapters", "course_lib.deploy")),
    (("course_lib.analysis",), ("course_lib.engine", "course_lib.chapters", "course_lib.deploy")),
    # Deploying a trained model needs no training loop and no chapter.
    (("course_lib.deploy",), ("course_lib.engine", "course_lib.chapters")),
    # measure/ sits wholly above the engine and the data: they read clocks and memory counters from
    # the ground floor (instruments/), never from the tools that drive them.
    (("course_lib.engine", "course_lib.data"), ("course_lib.measure",)),
    # The ground floor imports nothing of the project but the leaves.
    (("course_lib.instruments",), ("course_lib.data", "course_lib.engine", "course_lib.models", "course_lib.measure",
                                   "course_lib.analysis", "course_lib.chapters", "course_lib.ledger",
                                   "course_lib.deploy", "course_lib.runner", "course_lib.report", "course_lib.cli")),
    # A chapter's claims live in its chapters/ module: the engine measures, it does not judge.
    (("course_lib.engine",), ("course_lib.analysis.claims", "course_lib.chapters")),
    (("course_lib.devices",), ("course_lib.data", "course_lib.engine", "course_lib.models", "course_lib.measure",
                               "course_lib.analysis", "course_lib.chapters", "course_lib.ledger", "course_lib.deploy")),
]


def _matches(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("subjects, forbidden", RULES, ids=[r[0][0] for r in RULES])
def test_import_rules(subjects, forbidden):
    broken = sorted(f"{module} imports {target}" for module, targets in IMPORTS.items() if _matches(module, subjects)
                    for target in targets if _matches(target, forbidden) and not _matches(target, subjects))
    assert not broken, "; ".join(broken)


def clock_reads(path: Path) -> list[int]:
    """Lines of `path` that read a clock directly (time.perf_counter / time.time / time.monotonic)."""
    return sorted(node.lineno for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Attribute) and node.attr in ("perf_counter", "time", "monotonic")
                  and isinstance(node.value, ast.Name) and node.value.id == "time")


def test_data_reads_no_clock_of_its_own():
    """Every time data/ measures (the data wait, a build's duration) goes through the one timing
    helper, `instruments.timing`, which synchronises the device before the clock is read."""
    readers = {module_name(p): clock_reads(p) for p in MODULES if _matches(module_name(p), ("course_lib.data",))}
    assert {module: lines for module, lines in readers.items() if lines} == {}
    assert clock_reads(PACKAGE / "instruments" / "timing.py"), "the checker must see the helper's own clock"


def test_benchmarks_train_with_the_engines_step():
    """A benchmark that trains calls engine/step.py; only bench_engine.py writes a loop by hand, the
    one it compares the engine against."""
    hand_written = sorted(path.name for path in (ROOT / "benchmarks").glob("*.py") if path.name != "bench_engine.py"
                          and any(isinstance(node, ast.Attribute) and node.attr == "backward"
                                  for node in ast.walk(ast.parse(path.read_text()))))
    assert hand_written == []


def missing_project_attributes(source: str) -> list[str]:
    """`Y.attr` in `source` where Y is bound by `from course_lib... import X [as Y]` or `import course_lib.X as Y`
    and the imported object has no `attr` (a call to a function the library no longer has)."""
    tree, bound = ast.parse(source), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "course_lib":
            for alias in node.names:
                module = importlib.import_module(node.module)
                bound[alias.asname or alias.name] = (getattr(module, alias.name) if hasattr(module, alias.name)
                                                     else importlib.import_module(f"{node.module}.{alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name.split(".")[0] == "course_lib":
                    bound[alias.asname] = importlib.import_module(alias.name)
    return sorted({f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                   and node.value.id in bound and not hasattr(bound[node.value.id], node.attr)})


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")))
def test_benchmarks_call_what_the_library_has(script):
    """Every `study.x` a benchmark calls exists (bench_deploy called four removed studies and nobody ran it)."""
    assert missing_project_attributes((ROOT / "benchmarks" / script).read_text()) == []


def test_the_attribute_check_sees_a_removed_function():
    source = ("from course_lib.chapters import compress_and_deploy as study\n"
              "import course_lib.deploy.export as export\n"
              "study.quantization_study(); study.setup(); export.export_onnx(); export.no_such_thing")
    assert missing_project_attributes(source) == ["export.no_such_thing", "study.quantization_study"]


def test_only_main_imports_the_cli():
    importers = sorted(m for m, targets in IMPORTS.items() if "course_lib.cli" in targets)
    assert importers == ["course_lib.__main__"], importers


def test_argparse_lives_in_the_cli():
    users = sorted(module_name(p) for p in MODULES if "argparse" in {
        alias.name for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Import)
        for alias in node.names})
    assert users == ["course_lib.cli"], users


def test_the_rules_see_imports():
    """The reader finds function-level imports too (a rule checker that saw nothing would pass)."""
    assert "course_lib.data.datasets" in IMPORTS["course_lib.engine.train"]
    assert "course_lib.config" in IMPORTS["course_lib.devices"]
    assert _matches("course_lib.engine.train", ("course_lib.engine",))
    assert not _matches("course_lib.engineering", ("course_lib.engine",))


def test_every_module_has_a_docstring():
    missing = [module_name(p) for p in MODULES if p.name != "__init__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, missing


def test_the_development_pages_tree_lists_every_module_once():
    readme = (ROOT / "docs" / "development.md").read_text()
    tree = readme[readme.index("course_lib/\n├──"):]
    tree = tree[:tree.index("```")]
    listed = []
    folder = ""
    for line in tree.splitlines()[1:]:
        name = line.lstrip("│├└─ ").split()[0]
        if name.endswith("/"):
            folder = name
        elif name.endswith(".py"):
            indent = len(line) - len(line.lstrip("│├└─ "))
            listed.append((folder if indent > 4 else "") + name)
    modules = sorted(str(p.relative_to(PACKAGE)) for p in MODULES if p.name not in ("__init__.py", "__main__.py"))
    assert sorted(listed) == modules


SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
# Cycles inside a subpackage that are known and not yet untied: {subpackage: reason}. Keep it empty.
KNOWN_CYCLES: dict[str, str] = {}


def import_cycle(modules: dict[str, set[str]]) -> list[str]:
    """One cycle (first module repeated at the end) in the graph `modules` -> imported modules, or []."""
    state, path = {}, []  # state: 1 while on the current path, 2 when finished

    def visit(module):
        state[module] = 1
        path.append(module)
        for target in sorted(modules.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        state[module] = 2
        path.pop()
        return []

    for module in sorted(modules):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return []


def test_the_cycle_finder_names_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_no_import_circle_inside_a_subpackage(subpackage):
    """Modules of one subpackage import each other in one direction only (module-level and
    function-level imports alike), so each can be read, and moved, after the ones it needs."""
    if subpackage in KNOWN_CYCLES:
        pytest.xfail(KNOWN_CYCLES[subpackage])
    prefix = f"course_lib.{subpackage}"
    inside = {module: {target for target in targets if _matches(target, (prefix,)) and target != module}
              for module, targets in IMPORTS.items() if _matches(module, (prefix,))}
    cycle = import_cycle(inside)
    assert not cycle, f"import circle in {prefix}: " + " -> ".join(cycle)


def floor(module: str) -> str:
    """The subpackage or top-level module `module` belongs to: course_lib.engine.train -> course_lib.engine."""
    return ".".join(module.split(".")[:2])


def test_no_import_circle_between_subpackages():
    """The floors (leaves, instruments, data, models, engine, measure, analysis, deploy, chapters, the
    command line) import one another in one direction only: measure sits wholly above the engine."""
    floors: dict[str, set[str]] = {}
    for module, targets in IMPORTS.items():
        floors.setdefault(floor(module), set()).update(floor(t) for t in targets if floor(t) != floor(module))
    cycle = import_cycle(floors)
    assert not cycle, "import circle between floors: " + " -> ".join(cycle)
    assert "course_lib.engine" in floors["course_lib.measure"]  # the checker sees the floors it is about


# Test files about the project rather than one module: the notebooks, the README, the install files.
PROJECT_CHECKS = {"browser", "committed_results", "containers", "docs_code", "forkserver", "gpu_image",
                  "launch_recipes", "layout", "notebook_data", "notebooks", "packaging", "readme_commands", "rehearsal",
                  "solutions"}


def test_each_test_file_is_named_after_a_module():
    """tests/test_<name>.py tests course_lib's module or subpackage <name> (STYLE rule 1), so the tests
    of a module are found from its name, and a renamed module takes its tests' file along."""
    names = {p.stem for p in MODULES} | set(SUBPACKAGES)
    orphans = sorted(p.name for p in (ROOT / "tests").glob("test_*.py")
                     if p.stem[len("test_"):] not in names | PROJECT_CHECKS)
    assert orphans == []


CHAPTERS = sorted((PACKAGE / "chapters").glob("*.py"))


def test_every_chapter_has_one_shape():
    """A chapter's notebook starts from `<chapter>.setup(profile, ...)` (issue 45: one chapter shape): no
    chapter names it notebook_setup, study_setup, race_setup or chapter_setup; every module that defines
    a setup class defines `setup`; every setup class is a `chapters.setup.ChapterSetup` (profile, data,
    config, bundle, hardware, device, line()), keyword-only, and says itself in `line()` without arguments."""
    import dataclasses
    import importlib
    import inspect

    from course_lib.chapters.setup import ChapterSetup

    for path in CHAPTERS:
        if path.stem in ("__init__", "setup"):
            continue
        tree = ast.parse(path.read_text())
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert not functions & {"notebook_setup", "study_setup", "race_setup", "chapter_setup"}, path.name
        classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef) and "Setup" in node.name]
        if classes:
            assert "setup" in functions, f"{path.name} defines {classes} but no setup()"
        module = importlib.import_module(f"course_lib.chapters.{path.stem}")
        for name in classes:
            cls = getattr(module, name)
            assert issubclass(cls, ChapterSetup), f"{path.name}: {name} is not a ChapterSetup"
            assert all(field.kw_only for field in dataclasses.fields(cls)), f"{name}: positional fields"
            assert list(inspect.signature(cls.line).parameters) == ["self"], f"{name}.line takes arguments"



# A comparison of the profile with a profile's name, or a flag made from one (`smoke = profile == "smoke"`):
# the profile's sizes belong in the chapter's SIZES table, read with `chapters.setup.sizes`.
PROFILE_BRANCH = re.compile(r"""(?:\b(?:profile|resolved)\s*[!=]=\s*["'](?:smoke|cpu|gpu|rehearsal)["']"""
                            r"""|["'](?:smoke|cpu|gpu|rehearsal)["']\s*[!=]=\s*\w*profile\b"""
                            r"""|\b(?:profile|resolved)\s+(?:not\s+)?in\s*[(\[{]\s*["'](?:smoke|cpu|gpu))""")


def test_no_chapter_branches_on_the_profile_inline():
    """Issue 45: a chapter's per-profile sizes and choices live in its SIZES table (`chapters.setup.sizes`),
    not in `if profile == "smoke"` branches scattered through its functions."""
    found = [f"{path.name}:{number}: {line.strip()}" for path in CHAPTERS if path.name != "setup.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if PROFILE_BRANCH.search(line)]
    assert not found, "inline profile branches:\n" + "\n".join(found)


def test_the_profile_branch_pattern_sees_the_branches():
    for line in ('smoke = profile == "smoke"', 'if resolved != "cpu":', "x = 3 if self.profile == 'gpu' else 4",
                 'if profile in ("cpu", "gpu"):', 'return "cuda" if "gpu" == profile else "cpu"'):
        assert PROFILE_BRANCH.search(line), line
    for line in ('if device.type == "cpu":', 'sizes(SIZES, profile)["max_steps"]', 'row["device"] != "cpu"'):
        assert not PROFILE_BRANCH.search(line), line


LONGEST_FUNCTION = 60  # lines, docstring included (issue 45: no function in course_lib/ over 60)
SCREEN = 50  # lines: the training driver's `fit` and `prepare` each fit on one screen


def function_lengths(source: str) -> dict[str, int]:
    """Lines of every function and method in `source` (nested ones too), keyed by qualified-ish name."""
    lengths = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lengths[f"{node.name}:{node.lineno}"] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_function_in_the_library_is_longer_than_a_screen_and_a_bit():
    long = [f"{path.relative_to(ROOT)}:{name} ({lines} lines)" for path in MODULES
            for name, lines in function_lengths(path.read_text()).items() if lines > LONGEST_FUNCTION]
    assert not long, f"functions over {LONGEST_FUNCTION} lines (split them):\n" + "\n".join(long)


def test_the_training_driver_fits_on_one_screen():
    lengths = function_lengths((PACKAGE / "engine" / "train.py").read_text())
    for name in ("fit", "prepare"):
        (lines,) = [lines for key, lines in lengths.items() if key.split(":")[0] == name]
        assert lines <= SCREEN, f"engine/train.py {name} is {lines} lines, over {SCREEN}"


def test_the_function_length_count_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_FUNCTION))
    lengths = function_lengths(f"def long():\n{body}\n\n\nclass A:\n    def short(self):\n        return 1\n")
    assert lengths == {"long:1": LONGEST_FUNCTION + 1, f"short:{LONGEST_FUNCTION + 5}": 2}


# Issue 45: chapters/ at most 4,500 lines and course_lib/ under 25,298 (docs/development.md, "Size per room"). Both
# are still over; until they are met each is held at its measured size (2026-12-07) so neither grows meanwhile.
ROOM_BOUNDS = {"chapters": 4_500, "": 25_297}  # the design's bounds ("" is the whole of course_lib/)
ROOM_CEILINGS = {"chapters": 5_836, "": 27_934}  # today's sizes: lower them as the rooms shrink, never raise them


def lines_of(folder: Path) -> int:
    return sum(len(path.read_text().splitlines()) for path in folder.rglob("*.py"))


@pytest.mark.parametrize("room", sorted(ROOM_CEILINGS))
def test_the_library_does_not_grow_past_its_ceiling(room):
    lines = lines_of(PACKAGE / room)
    assert lines <= ROOM_CEILINGS[room], (f"course_lib/{room} has {lines} lines, over its ceiling "
                                          f"{ROOM_CEILINGS[room]} (bound {ROOM_BOUNDS[room]}): make room before adding")
    assert ROOM_BOUNDS[room] <= ROOM_CEILINGS[room]


def test_the_line_count_counts_every_line_of_every_module(tmp_path):
    (tmp_path / "inner").mkdir()
    (tmp_path / "a.py").write_text("x = 1\ny = 2\n")
    (tmp_path / "inner" / "b.py").write_text("z = 3\n")
    (tmp_path / "notes.txt").write_text("not python\n")
    assert lines_of(tmp_path) == 3
