"""The documentation is checked like code.

* The docs speak of the project, not of how it was built: none of the words
  in `FORBIDDEN_WORDS` appears in README.md, BENCHMARKS.md or docs/**/*.md.
* Every relative link in them resolves to a file of the repository, and an
  anchor into a Markdown page to one of its headings.
* Every command line in their fenced code blocks that runs one of the
  project's commands (`python train.py ...`, `python -m keras_yolo_mgpu.X ...`,
  `yolo-train ...`, `python scripts/<name>.py ...`, `python tools/<name>.py
  [subcommand] ...`, `make target`) names flags the command has: the flags go
  through the command's own argparse parser (a script's or tool's: its source,
  or its subcommand's section of it), so a renamed or removed flag or
  subcommand, or a value of the wrong type, fails here.
* Every script or tool they, the Makefile, the tests, scripts/ and tools/
  name (`scripts/<name>.py`, `tools/<name>.py`) is in the repository.

`DOCUMENTED_AHEAD` lists the few flags and pages the README shows before the
code that provides them is merged; each is tied to the page that documents
it and is accepted as missing only while that page is missing too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Words that describe how the project was worked on, not the project. Matched
# case-insensitively; "session" also inside longer words (TensorFlow's
# `tf.Session` has no place in these docs either).
FORBIDDEN_WORDS = {
    "session": re.compile(r"session", re.IGNORECASE),
    "lent": re.compile(r"\blent\b", re.IGNORECASE),
    "device time": re.compile(r"\bdevice\s+time\b", re.IGNORECASE),
    "agent": re.compile(r"\bagents?\b", re.IGNORECASE),
}

# Flag or page -> the page that documents it. While that page is absent
# (its code is not merged yet) the flag may be missing from the parsers and
# a link to the page may dangle; once the page exists, both are checked.
DOCUMENTED_AHEAD = {
    "--data": "docs/data.md",
    "--recipe": "docs/training.md",
    "--save-period": "docs/training.md",
    "--precision": "docs/gpu.md",
    "--no-jit": "docs/gpu.md",
    "docs/data.md": "docs/data.md",
    "docs/training.md": "docs/training.md",
    "docs/inference.md": "docs/inference.md",
    "docs/gpu.md": "docs/gpu.md",
}

# Top-level scripts (keras-yolo3's names) -> their command module in keras_yolo_mgpu.cli.
SCRIPTS = {
    "train.py": "train",
    "train_bottleneck.py": "train_bottleneck",
    "yolo_video.py": "detect",
    "evaluate.py": "evaluate",
    "convert.py": "convert",
    "kmeans.py": "kmeans",
    "voc_annotation.py": "voc",
    "coco_annotation.py": "coco",
}

# Commands that are not the project's (their flags are not ours to check).
FOREIGN_PYTHON_MODULES = {"pytest", "pip", "venv", "tensorboard"}


def documentation_files() -> list[Path]:
    """README.md, BENCHMARKS.md and docs/**/*.md: tracked ones, and new ones not yet added."""
    files = {ROOT / "README.md", ROOT / "BENCHMARKS.md", *ROOT.glob("docs/**/*.md")}
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        tracked = subprocess.run(
            ["git", "ls-files", "README.md", "BENCHMARKS.md", "docs"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        files.update(ROOT / name for name in tracked if name.endswith(".md"))
    return sorted(path for path in files if path.is_file())


DOC_FILES = documentation_files()


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _pending(name: str) -> bool:
    """Whether `name` (a flag or a page) is documented ahead of its code: its page is not there yet."""
    page = DOCUMENTED_AHEAD.get(name)
    return page is not None and not (ROOT / page).exists()


def test_documentation_files_found():
    names = {_doc_id(path) for path in DOC_FILES}
    assert {"README.md", "BENCHMARKS.md"} <= names
    assert any(name.startswith("docs/") for name in names)


@pytest.mark.parametrize("path", DOC_FILES, ids=_doc_id)
def test_no_words_about_how_the_project_was_built(path):
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for word, pattern in FORBIDDEN_WORDS.items():
            if pattern.search(line):
                found.append(f"{_doc_id(path)}:{number}: {word!r}: {line.strip()[:100]}")
    assert not found, "name the date and the machine instead:\n" + "\n".join(found)


def test_forbidden_words_are_caught_and_neighbours_are_not():
    def caught(text):
        return [word for word, pattern in FORBIDDEN_WORDS.items() if pattern.search(text)]

    assert caught("measured in a previous Session") == ["session"]
    assert caught("other sessions' jobs") == ["session"]
    assert caught("a GPU lent to us") == ["lent"]
    assert caught("30 minutes of device time") == ["device time"]
    assert caught("other agents' jobs") == ["agent"]
    assert caught("excellent, silently, relentless, per-device timings") == []


# -- links --------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(text: str) -> list[tuple[str, str]]:
    """(file, anchor) of the Markdown links and images in `text` that stay in the repository.

    `file` is "" for an anchor in the same page; `anchor` is "" when the link has none.
    """
    targets = [a or b for a, b in LINK.findall(text)] + IMAGE.findall(text)
    kept = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        kept.append((file, anchor))
    return kept


def _outside_code(text: str) -> str:
    """`text` without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page (and explicit `<a id=...>` / `name=`)."""
    anchors, seen = set(), {}
    for heading in re.findall(
        r"^#{1,6}\s+(.+?)\s*#*\s*$", re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S), re.M
    ):
        slug = re.sub(r"[^\w\- ]", "", re.sub(r"<[^>]+>", "", heading).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    anchors.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return anchors


def test_links_and_anchors_parse():
    text = "[a](docs/x.md#part) [b](https://e.org) [c](#top) ![d](img/p.png)\n[e]: ../f.md\n`[g](no.md)`"
    assert relative_links(_outside_code(text)) == [
        ("docs/x.md", "part"),
        ("", "top"),
        ("../f.md", ""),
        ("img/p.png", ""),
    ]
    page = "# GPU (one H100)\n## `align`: check it\n## Float32, float64 and mixed precision\n## Notes\n## Notes\n"
    assert heading_anchors(page) == {
        "gpu-one-h100",
        "align-check-it",
        "float32-float64-and-mixed-precision",
        "notes",
        "notes-1",
    }


@pytest.mark.parametrize("path", DOC_FILES, ids=_doc_id)
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    broken = []
    for target, anchor in relative_links(_outside_code(text)):
        resolved = (path.parent / target).resolve() if target else path
        if not resolved.exists():
            name = str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else target
            if not _pending(name):
                broken.append(target)
        elif anchor and resolved.suffix == ".md":
            if anchor not in heading_anchors(resolved.read_text(encoding="utf-8")):
                broken.append(f"{target}#{anchor}")
    assert not broken, f"{_doc_id(path)}: links to missing files or headings: {broken}"


# -- commands -----------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.MULTILINE | re.DOTALL)
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTIONS = {">", ">>", "<", "2>", "2>&1", "&>"}
PLACEHOLDER = re.compile(r"\.\.\.|<[A-Za-z_][^>]*>|\[|\{|\$|…")


INLINE_COMMAND = re.compile(r"`((?:\.venv/bin/)?python3? [^`\n]+|make [\w -]+)`")


def command_lines(text: str) -> list[tuple[str, bool]]:
    """(line, whole) for the command lines of `text`.

    Every line of its fenced blocks, continuation lines (`\\`) joined and
    prompts (`$ `) removed, is a whole command (`whole`: True). Inline code
    spans that start with `python` or `make` (commands in tables, names in
    prose) may leave out required arguments: only their flags are checked.
    """
    lines = [(span, False) for span in INLINE_COMMAND.findall(FENCE.sub("", text))]
    for _, block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            lines.append((line[2:] if line.startswith("$ ") else line, True))
    return [(line, whole) for line, whole in lines if line and not line.startswith("#")]


def simple_commands(line: str) -> list[list[str]]:
    """`line` split into simple commands at `&&`, `;`, `|`, ...; comments and redirections dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: not a command line (an output block)
        return []
    commands, current, skip_next = [], [], False
    for token in tokens:
        if skip_next:
            skip_next = False
        elif token in SEPARATORS:
            commands.append(current)
            current = []
        elif token in REDIRECTIONS:
            skip_next = token != "2>&1"
        else:
            current.append(token)
    commands.append(current)
    return [command for command in commands if command]


def _strip_prefixes(tokens: list[str]) -> list[str]:
    """Drops environment assignments, `nice -n N`, `timeout S`, `time`, `/usr/bin/time -v`, `env` before a command."""
    while tokens:
        head = tokens[0]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", head) or head in ("env", "time"):
            tokens = tokens[1:]
        elif head == "timeout":
            tokens = tokens[2:]
        elif head == "nice":
            tokens = tokens[3:] if len(tokens) > 2 and tokens[1] == "-n" else tokens[1:]
        elif head.endswith("/time"):
            tokens = tokens[2:] if len(tokens) > 1 and tokens[1] == "-v" else tokens[1:]
        else:
            return tokens
    return tokens


def console_scripts() -> dict[str, str]:
    """pyproject.toml's `[project.scripts]`: console script name -> command module."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[)", text, re.MULTILINE | re.DOTALL)
    pairs = re.findall(r'^([\w-]+)\s*=\s*"([\w.]+):\w+"', section.group(1) if section else "", re.MULTILINE)
    return dict(pairs)


class Command:
    """One documented invocation of a project command: where its flags are defined, and its arguments."""

    def __init__(self, label: str, arguments: list[str], *, module: str | None = None, source: Path | None = None):
        self.label = label
        self.arguments = arguments
        self.whole = True  # False: a span in prose or a table, which may leave out required arguments
        self.module = module  # a module with build_parser(), checked by parsing
        self.source = source  # else a file whose text must define every flag shown


def _project_module_command(module: str, arguments: list[str]) -> Command | None:
    """`python -m <module> ...` of the project, resolved to the module whose parser reads `arguments`."""
    if module != "keras_yolo_mgpu" and not module.startswith("keras_yolo_mgpu."):
        return None
    path = ROOT / Path(*module.split("."))
    runnable = path / "__main__.py" if path.is_dir() else path.with_suffix(".py")
    if not runnable.exists():
        return Command(module, [], source=runnable)  # reported: no such module
    cli = ROOT / "keras_yolo_mgpu" / "cli"
    if module == "keras_yolo_mgpu.bench" and arguments and not arguments[0].startswith("-"):
        sub = cli / f"bench_{arguments[0]}.py"
        if not sub.exists():
            return Command(f"{module} {arguments[0]}", [], source=sub)  # reported: no such benchmark
        return Command(f"{module} {arguments[0]}", arguments[1:], module=f"keras_yolo_mgpu.cli.{sub.stem}")
    if module == "keras_yolo_mgpu.align" and arguments[:1] == ["diff"]:
        return Command(f"{module} diff", arguments[1:], module="keras_yolo_mgpu.cli.align:diff")
    name = module.split(".")[-1]  # keras_yolo_mgpu.X is an alias of keras_yolo_mgpu.cli.X
    if (cli / f"{name}.py").exists():
        return Command(module, arguments, module=f"keras_yolo_mgpu.cli.{name}")
    return Command(module, arguments, source=runnable)


def project_command(tokens: list[str]) -> Command | None:
    """The project command that `tokens` runs, or None for any other program."""
    tokens = _strip_prefixes(tokens)
    if not tokens:
        return None
    program, rest = tokens[0], tokens[1:]
    if program in console_scripts():
        module = console_scripts()[program]
        return _project_module_command(module, rest) or Command(program, rest, source=ROOT / "pyproject.toml")
    if re.search(r"(^|/)python[0-9.]*$", program) and rest:
        if rest[0] == "-m" and len(rest) > 1:
            return _project_module_command(rest[1], rest[2:])
        script = rest[0]
        if Path(script).name in SCRIPTS and "/" not in script:
            module = f"keras_yolo_mgpu.cli.{SCRIPTS[script]}"
            return Command(script, rest[1:], module=module)
        if script.startswith(("scripts/", "tools/")) and script.endswith(".py"):
            return Command(script, rest[1:], source=ROOT / script)
    if program == "make":
        return Command("make", rest, source=ROOT / "Makefile")
    return None


def documented_commands() -> list[tuple[str, str, Command]]:
    """(file, line, command) of every project command in the fenced blocks of the docs, placeholders skipped."""
    found = []
    for path in DOC_FILES:
        for line, whole in command_lines(path.read_text(encoding="utf-8")):
            if PLACEHOLDER.search(line.split(" #", 1)[0]):
                continue  # `...`, `<weights>`, `[--gpus N]`, `$VAR`: a pattern, not a command
            for tokens in simple_commands(line):
                command = project_command(tokens)
                if command is not None:
                    command.whole = whole
                    found.append((_doc_id(path), line, command))
    return found


def _parser(module: str) -> argparse.ArgumentParser | None:
    """The command's parser from its `build_parser()` (`module:diff` -> `build_diff_parser()`), if it has one."""
    name, _, variant = module.partition(":")
    build = getattr(importlib.import_module(name), f"build_{variant}_parser" if variant else "build_parser", None)
    return build() if build is not None else None


def _flags(arguments: list[str]) -> list[str]:
    return [token.split("=", 1)[0] for token in arguments if re.match(r"^--?[A-Za-z]", token)]


def subcommands(source: Path) -> list[str]:
    """The subcommands of a tool (its `SUBCOMMANDS` table), or [] for a script without any."""
    table = re.search(r"^SUBCOMMANDS = \{(.*?)^\}", source.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    return re.findall(r'^\s*"([\w-]+)":', table.group(1), re.MULTILINE) if table else []


def _defining_text(source: Path, arguments: list[str]) -> tuple[str, str | None]:
    """The source text that must define the flags, and what is wrong with the subcommand, if anything.

    A tool with subcommands keeps each in its own section (`# -- <name> ---`, up to the next one).
    """
    text = source.read_text(encoding="utf-8")
    names = subcommands(source)
    if not names or arguments[:1] in (["-h"], ["--help"]):
        return text, None
    if arguments[:1] and arguments[0] in names:
        end = r"(?=^# -- |^SUBCOMMANDS = )"
        section = re.search(rf"^# -- {re.escape(arguments[0])} -+\n(.*?){end}", text, re.MULTILINE | re.DOTALL)
        return (section.group(1) if section else text), None
    return "", f"no subcommand {arguments[:1]} in {source.relative_to(ROOT)}: {names}"


def _tool_parser(source: Path) -> argparse.ArgumentParser | None:
    """The parser of a tool that builds one (`build_parser()`, e.g. on top of a command's), imported as it runs."""
    if not source.is_file() or "\ndef build_parser(" not in source.read_text(encoding="utf-8"):
        return None
    sys.path.insert(0, str(source.parent))  # a tool imports its neighbours, as `python tools/<name>.py` lets it
    try:
        return importlib.import_module(source.stem).build_parser()
    finally:
        sys.path.remove(str(source.parent))


def check_command(command: Command) -> str | None:
    """None when the documented arguments fit the command, else what is wrong."""
    flags = _flags(command.arguments)
    parser = _parser(command.module) if command.module is not None else None
    if parser is None and command.module is not None:
        # A command that builds its parser another way: its source must define the flags.
        command.source = Path(importlib.import_module(command.module.partition(":")[0]).__file__)
    if parser is None and command.source is not None and command.source.parent == ROOT / "tools":
        parser = _tool_parser(command.source)
    if parser is None:
        if command.label == "make":
            targets = re.findall(r"^([\w.-]+):", command.source.read_text(encoding="utf-8"), re.MULTILINE)
            missing = [target for target in command.arguments if not target.startswith("-") and target not in targets]
            return f"no Makefile target {missing}" if missing else None
        if not command.source.exists():
            return f"{command.source.relative_to(ROOT)} does not exist"
        text, problem = _defining_text(command.source, command.arguments)
        if problem:
            return problem
        missing = [flag for flag in flags if f'"{flag}"' not in text and not _pending(flag)]
        return f"flags not defined in {command.source.relative_to(ROOT)}: {missing}" if missing else None
    known = {option for action in parser._actions for option in action.option_strings}
    if "-h" in flags or "--help" in flags:
        return None
    ahead = [flag for flag in flags if flag not in known and _pending(flag)]
    if ahead or not command.whole:
        # A span in prose, or flags of code not merged yet: the other flags must
        # exist; values and required flags are checked in whole commands once
        # the page of those flags is there.
        unknown = [flag for flag in flags if flag not in known and flag not in ahead]
        return f"unknown flags {unknown}" if unknown else None
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(command.arguments)
    except SystemExit as exit_status:
        if exit_status.code:
            return errors.getvalue().strip().splitlines()[-1]
    return None


COMMANDS = documented_commands()


def test_documented_commands_found():
    labels = {command.label for _, _, command in COMMANDS}
    assert {"train.py", "evaluate.py", "make"} <= labels, labels


@pytest.mark.parametrize(
    "doc, line, command",
    COMMANDS,
    ids=[f"{doc}:{command.label}:{index}" for index, (doc, _, command) in enumerate(COMMANDS)],
)
def test_documented_command_parses(doc, line, command):
    problem = check_command(command)
    assert problem is None, f"{doc}: `{line}`: {problem}"


@pytest.mark.parametrize(
    "line",
    [
        "python train.py --epoch 3",  # misspelt flag
        "python train.py --batch-size eight",  # wrong type
        "python -m keras_yolo_mgpu.bench train --no-such-flag",
        "python -m keras_yolo_mgpu.align diff a.h5 b.h5 --thresold 1e-3",
        "nice -n 19 .venv/bin/python tools/reports.py recipe-table --no-such-flag x",
        "python tools/reports.py no-such-report --out x",
        "python tools/replicas.py seed --steps 5",  # a flag of another of the tool's subcommands (align-float32)
        "python tools/train_step_compare.py --tiny --input-size 100",  # a tool on a command's parser: its values
        "python tools/train_step_compare.py --backends tensorflow --stepz 2",
        "make no-such-target",
        "python -m keras_yolo_mgpu.train --epochs 3",  # no such module: train.py or keras_yolo_mgpu.cli.train
        "python -m keras_yolo_mgpu.bench no-such-benchmark",
        "yolo-train --epoch 3",
    ],
)
def test_a_broken_command_is_caught(line):
    (tokens,) = simple_commands(line)
    command = project_command(tokens)
    assert command is not None
    assert check_command(command) is not None


def test_a_good_command_passes_and_others_are_ignored():
    line = "cd x && python train.py --epochs 3 --gpus 2 > log.txt  # comment"
    commands = [project_command(tokens) for tokens in simple_commands(line)]
    assert commands[0] is None
    assert commands[1].label == "train.py" and commands[1].arguments == ["--epochs", "3", "--gpus", "2"]
    assert check_command(commands[1]) is None
    assert project_command(["python", "-m", "pytest", "-q"]) is None
    for tokens in (["yolo-train", "--epochs", "3"], ["python3", "-m", "keras_yolo_mgpu.cli.train", "--epochs", "3"]):
        assert check_command(project_command(tokens)) is None


# -- scripts and tools ------------------------------------------------------------

SCRIPT_PATH = re.compile(r"(?<![\w./-])((?:scripts|tools)/\w+\.py)(?: ([a-z][\w-]*))?")
NAMING_FILES = sorted(
    {*DOC_FILES, ROOT / "Makefile", *ROOT.glob("tests/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("tools/*.py")}
)


@pytest.mark.parametrize("path", NAMING_FILES, ids=_doc_id)
def test_named_scripts_and_tools_exist(path):
    """Each `scripts/<name>.py` and `tools/<name>.py` in the text, prose too, is a file; in docs, with a subcommand."""
    missing = []
    for match in SCRIPT_PATH.finditer(path.read_text(encoding="utf-8")):
        name, word = match.groups()
        if not (ROOT / name).is_file():
            missing.append(name)
        elif path.suffix == ".md" and word and subcommands(ROOT / name) and word not in subcommands(ROOT / name):
            missing.append(f"{name} {word}")
    assert not missing, f"{_doc_id(path)} names what the repository does not have: {sorted(set(missing))}"
