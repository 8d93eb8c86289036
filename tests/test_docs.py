"""The docs name only what exists: every launcher option written in README.md and docs/*.md is an option of that
command in the typer CLI, and every .env key they name as a setting is in .env.example or one of compose's
${...} variables.

Only launcher command lines count as options (a line or a backticked span that starts with `launcher`, up to a
standalone `--`, after which the words belong to the job), plus backticked options later on a prose line that
names `launcher SUBCOMMAND`; mpirun's, docker's and the trainer's own flags are left alone. A key counts as a
setting in a `.env`-style line of a code block (`KEY=value` alone), in `KEY=value` words before
`docker compose`, and in prose as a backticked `KEY` (or `KEY=value`) followed by "in .env", or right after
"in `.env` as/with".
"""

from __future__ import annotations

import ast
import io
import os
import re
import shlex
import shutil
import subprocess
import tokenize
from pathlib import Path

import pytest
import typer

from launcher.cli import app

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
END_OF_OPTIONS = re.compile(r"(?<!\S)--(?!\S)")
SPAN = re.compile(r"`([^`]+)`")
COMMAND_LINE = re.compile(r"^(?:\$\s+)?(?:\S*/)?launcher(?:\s+(.*))?$", re.DOTALL)
KEY = r"[A-Z][A-Z0-9]*(?:_(?:[A-Z0-9]+|<[A-Z]+>))*"
ENV_FILE = r"`?\.env`?(?![\w.-])"
KEY_IN_ENV = re.compile(rf"`({KEY})(?:=[^`]*)?`\s+in\s+{ENV_FILE}")
ENV_AS_KEY = re.compile(rf"in\s+{ENV_FILE}(?:\s+as|\s+with|:)\s+`({KEY})=[^`]*`((?:\s+(?:with|and)\s+`{KEY}=[^`]*`)*)")
CHAINED_KEY = re.compile(rf"`({KEY})=")
ENV_LINE = re.compile(rf"^({KEY})=\S*(?:\s+#.*)?$")
ASSIGNMENT = re.compile(rf"^({KEY})=")
# launcher/host/planning/access.py node_key: a node's engine address and TLS variables
PER_NODE_ENGINE = re.compile(r"DOCKER_(?:HOST|TLS_VERIFY|CERT_PATH)_(?:<NODE>|[A-Z0-9_]+)")
# `--gpus` (a count or GPU IDs; `--gpus-per-node` is its alias) on start and doctor: the docs may name it while the
# option lands in launcher/cli.py.
EXPECTED_SOON = {"start": {"--gpus"}, "doctor": {"--gpus"}}


def cli_options() -> dict[str, set[str]]:
    """Each command's options (with --no-... forms and the --help every command has); '' is the group's own."""
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    group_context = group.context_class(group, info_name="launcher")
    commands = {"": {opt for param in group.get_params(group_context) for opt in param.opts}}
    for name, command in group.commands.items():
        context = command.context_class(command, info_name=name, parent=group_context)
        # A command with commands of its own (`launcher export mpijob`, `launcher export sbatch`): any of theirs.
        own = [command, *getattr(command, "commands", {}).values()]
        commands[name] = {
            opt
            for each in own
            for param in each.get_params(context)
            for opt in [*param.opts, *getattr(param, "secondary_opts", [])]
        } | EXPECTED_SOON.get(name, set())
    return commands


def allowed_keys() -> set[str]:
    """The keys .env.example sets (or shows commented out) and the variables compose's files read."""
    keys = set()
    for line in (REPO / ".env.example").read_text().splitlines():
        match = re.match(rf"^#?\s?({KEY})=\S*$", line)
        if match:
            keys.add(match.group(1))
    for compose_file in REPO.glob("compose*.yaml"):
        keys |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", compose_file.read_text()))
    return keys


def blocks(text: str) -> tuple[list[tuple[int, str]], list[list[tuple[int, str]]]]:
    """(code lines, prose paragraphs), each line with its number; a paragraph is a run of non-blank prose lines."""
    code: list[tuple[int, str]] = []
    paragraphs: list[list[tuple[int, str]]] = [[]]
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            paragraphs.append([])
        elif fenced:
            code.append((number, line.strip()))
        elif line.strip():
            paragraphs[-1].append((number, line))
        else:
            paragraphs.append([])
    return code, [paragraph for paragraph in paragraphs if paragraph]


def command_options(words: str) -> tuple[str, list[str]]:
    """The subcommand and the options of the text after `launcher`, up to a standalone `--` or a # comment."""
    words = re.split(r"(?:^|\s)#", words, maxsplit=1)[0]
    words = END_OF_OPTIONS.split(words, maxsplit=1)[0]
    subcommand = next((word for word in words.split() if not word.startswith("-")), "")
    return ("*" if subcommand == "..." else subcommand), OPTION.findall(words)  # `launcher ...`: any command


def option_uses(text: str, commands: set[str]) -> list[tuple[int, str, str]]:
    """(line, subcommand or '*' for any, option) for every launcher option the text writes."""
    uses: list[tuple[int, str, str]] = []

    def add_command(number: int, rest: str) -> None:
        subcommand, options = command_options(rest or "")
        uses.append((number, subcommand, ""))  # the subcommand itself must exist
        uses.extend((number, subcommand, option) for option in options)

    code, paragraphs = blocks(text)
    for number, line in code:
        match = COMMAND_LINE.match(line)
        if match:
            add_command(number, match.group(1))
    mention = re.compile(rf"(?<![\w./-])launcher\s+(?:{'|'.join(sorted(c for c in commands if c))})\b")
    for paragraph in paragraphs:
        joined = "\n".join(line for _, line in paragraph)
        line_of = [number for number, line in paragraph for _ in range(len(line) + 1)]
        mentioned: set[int] = set()  # lines with a launcher command named so far
        for position, kind, body in sorted(
            [(m.start(), "mention", "") for m in mention.finditer(joined)]
            + [(m.start(), "span", m.group(1).replace("\n", " ")) for m in SPAN.finditer(joined)]
        ):
            number = line_of[position]
            if kind == "mention":
                mentioned.add(number)
                continue
            match = COMMAND_LINE.match(body)
            if match:
                add_command(number, match.group(1))
                mentioned.add(number)
            elif number in mentioned and body.startswith("-"):
                uses.extend((number, "*", option) for option in command_options(body)[1])
            elif number in mentioned and body.split()[0] in commands and " -" in body:
                add_command(number, body)
    return uses


def option_problems(text: str, cli: dict[str, set[str]]) -> list[str]:
    every = set().union(*cli.values())
    problems = []
    for number, subcommand, option in option_uses(text, set(cli)):
        if subcommand not in cli and subcommand != "*":
            if not option:
                problems.append(f"line {number}: `launcher {subcommand}`: no such command")
        elif option and option not in (every if subcommand == "*" else cli[subcommand]):
            where = "any command" if subcommand == "*" else f"launcher {subcommand or '(group)'}"
            problems.append(f"line {number}: {option} is not an option of {where}")
    return problems


def key_uses(text: str) -> list[tuple[int, str]]:
    """(line, key) for every .env key the text names as a setting."""
    uses: list[tuple[int, str]] = []

    def compose_prefix(number: int, command: str) -> None:
        try:
            words = shlex.split(command, comments=True)
        except ValueError:
            return
        keys = []
        while words and (assignment := ASSIGNMENT.match(words[0])):
            keys.append(assignment.group(1))
            words.pop(0)
        if words[:2] == ["docker", "compose"]:
            uses.extend((number, key) for key in keys)

    code, paragraphs = blocks(text)
    for number, line in code:
        match = ENV_LINE.match(line)
        if match:
            uses.append((number, match.group(1)))
        else:
            compose_prefix(number, line)
    for paragraph in paragraphs:
        joined = "\n".join(line for _, line in paragraph)
        line_of = [number for number, line in paragraph for _ in range(len(line) + 1)]
        for match in KEY_IN_ENV.finditer(joined):
            uses.append((line_of[match.start()], match.group(1)))
        for match in ENV_AS_KEY.finditer(joined):
            uses.append((line_of[match.start()], match.group(1)))
            uses.extend((line_of[match.start()], key) for key in CHAINED_KEY.findall(match.group(2)))
        for match in SPAN.finditer(joined):
            compose_prefix(line_of[match.start()], match.group(1).replace("\n", " "))
    return uses


def key_problems(text: str, keys: set[str]) -> list[str]:
    return [
        f"line {number}: {key} is not a key of .env.example or a variable of compose's files"
        for number, key in key_uses(text)
        if key not in keys and not PER_NODE_ENGINE.fullmatch(key)
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_launcher_option_in_the_docs_exists(doc):
    assert option_problems(doc.read_text(), cli_options()) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_env_key_in_the_docs_exists(doc):
    assert key_problems(doc.read_text(), allowed_keys()) == []


def test_the_docs_are_read_at_all():
    """The extraction finds what the README plainly writes (a parser that finds nothing would pass everything)."""
    readme = (REPO / "README.md").read_text()
    options = {option for _, _, option in option_uses(readme, set(cli_options()))}
    assert {"--nodes", "--gpus", "--workdir", "--network-interface", "--push-image"} <= options
    assert {"NODES", "NODE_NETWORK_INTERFACE", "TRAIN_COMMAND", "WORKDIR", "GPUS"} <= {k for _, k in key_uses(readme)}
    assert len(DOCS) >= 9


SAMPLE = """\
Start with `launcher start --nodes a,b --no-such-flag`, then `launcher doctor` and `--also-no-such-flag`.

```sh
launcher stop --follow
launcher strat --nodes a
launcher start --nodes a,b -- python train.py --epochs 5 --not-ours
mpirun -np 2 --bind-to none python train.py
docker compose up --exit-code-from launcher
NO_SUCH_KEY=1 WORKERS=3 docker compose up
NO_SUCH_ENV_LINE=1
```

Set `MISSING_KEY` in `.env`, or `NODES` in `.env`; `HOROVOD_CYCLE_TIME=0.2` is Horovod's own.
Once in `.env` as `COMPOSE_FILE=compose.yaml:compose.gpu.yaml` with `OTHER_MISSING=N`.
The trainer takes `--epochs`, and `docker compose run --rm --no-deps launcher python -m app.report`.
"""


def test_a_made_up_option_or_key_is_reported():
    problems = option_problems(SAMPLE, cli_options())
    assert problems == [
        "line 4: --follow is not an option of launcher stop",
        "line 5: `launcher strat`: no such command",
        "line 1: --no-such-flag is not an option of launcher start",
        "line 1: --also-no-such-flag is not an option of any command",
    ]
    assert key_problems(SAMPLE, allowed_keys()) == [
        "line 9: NO_SUCH_KEY is not a key of .env.example or a variable of compose's files",
        "line 10: NO_SUCH_ENV_LINE is not a key of .env.example or a variable of compose's files",
        "line 13: MISSING_KEY is not a key of .env.example or a variable of compose's files",
        "line 14: OTHER_MISSING is not a key of .env.example or a variable of compose's files",
    ]


# --- the front door: the README's budget and order, links, the quick start's scripts, the words users read ---------
README = REPO / "README.md"
README_LINES = 200
README_WIDTH = 120
PARAGRAPH_LINES = 8
README_ORDER = ["Quick start", "One host", "Several hosts", "Your own script", "In CI", "What was tested", "More"]
GLOSSARY = ["node", "worker", "rank", "slot", "spare", "cluster ID", "job agent"]
FIELD_WORDS = r"doors?|rooms?|lifelines?"
"""The project's shorthand that no user-visible text may say, the code's strings and comments included: a "door"
is a launch method (the launcher, compose, an MPIJob), a "room" a package or a pytest-xdist worker, a "lifeline" the
job agent's ssh connection to a worker."""
SHORTHAND = re.compile(rf"\b(?:{FIELD_WORDS}|test hosts?|offline path|online path)\b", re.IGNORECASE)
"""The words the README, docs/, .env.example and --help avoid: FIELD_WORDS, and the tests' own names for things."""
CODE_SHORTHAND = re.compile(rf"\b(?:{FIELD_WORDS})\b", re.IGNORECASE)
DOCS_WIDTH = 120
LINK = re.compile(r"\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str) -> str:
    """The text with its fenced code blocks and inline code spans blanked (line numbers kept)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return re.sub(r"`[^`]*`", lambda span: re.sub(r"[^\n]", " ", span.group(0)), "\n".join(lines))


def headings(text: str) -> list[str]:
    return [match.group(2) for line in prose(text).splitlines() if (match := HEADING.match(line))]


def anchors(text: str) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    one numbered."""
    seen: dict[str, int] = {}
    found = set()
    for line in text.splitlines():
        match = HEADING.match(line)
        if not match or line.startswith("    "):
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(2).strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def fenced_headings_removed(text: str) -> str:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        lines.append("" if fenced else line)
    return "\n".join(lines)


def link_problems(path: Path, text: str) -> list[str]:
    """Every relative link of a Markdown file that names no file, or an anchor its target lacks."""
    problems = []
    cleaned = prose(text)
    for match in LINK.finditer(cleaned):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        line = cleaned.count("\n", 0, match.start()) + 1
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve()
        if file_part and not linked.exists():
            problems.append(f"{path.name}:{line}: {target}: no such file")
        elif anchor and (
            (file_part and linked.suffix != ".md")
            or anchor not in anchors(fenced_headings_removed(linked.read_text() if file_part else text))
        ):
            problems.append(f"{path.name}:{line}: {target}: no such anchor")
    return problems


def paragraphs(text: str) -> list[tuple[int, int]]:
    """(first line, line count) of every prose paragraph and list item, outside code, tables and headings."""
    found: list[tuple[int, int]] = []
    current: list[int] = []
    fenced = False

    def close() -> None:
        if current:
            found.append((current[0], len(current)))
            current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            close()
        elif fenced or not line.strip() or HEADING.match(line) or line.lstrip().startswith("|"):
            close()
        else:
            if re.match(r"\s*(?:[-*]|\d+\.)\s", line):
                close()
            current.append(number)
    close()
    return found


def section(text: str, title: str) -> str:
    """A `## title` section's text, up to the next `## ` heading."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def help_texts() -> dict[str, str]:
    """Every text `--help` shows: the group's and each command's help, and each option's."""
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    group_context = group.context_class(group, info_name="launcher")
    texts = {"launcher": group.help or ""}
    commands = dict(group.commands)
    for name, command in group.commands.items():  # `launcher export mpijob`, `launcher export sbatch`
        commands |= {f"{name} {sub}": each for sub, each in getattr(command, "commands", {}).items()}
    for name, command in commands.items():
        context = command.context_class(command, info_name=name, parent=group_context)
        texts[f"launcher {name}"] = command.help or ""
        for param in command.get_params(context):
            texts[f"launcher {name} {'/'.join(param.opts)}"] = getattr(param, "help", None) or ""
    return texts


def test_the_readme_keeps_its_budget():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines, over {README_LINES}: move detail to docs/"
    wide = [f"line {number}: {len(line)}" for number, line in enumerate(lines, 1) if len(line) > README_WIDTH]
    assert wide == [], f"README.md lines over {README_WIDTH} characters"


def test_the_readme_reads_in_order():
    """What it is, the launch path's picture, then quick start, one host, several hosts, your own script, CI, what
    was tested, the docs."""
    text = README.read_text()
    sections = [heading for heading in headings(text) if heading in README_ORDER]
    assert sections == README_ORDER
    assert text.index("```mermaid") < text.index("## Quick start")
    picture = text[text.index("```mermaid") : text.index("```", text.index("```mermaid") + 3)]
    for step in ("launcher start", "docker compose up", "worker", "job agent", "mpirun", "ranks", "exit status"):
        assert step in picture, step


def test_the_readme_defines_the_words_it_uses():
    table = README.read_text().split("## Quick start")[0]
    defined = {row.split("|")[1].strip() for row in table.splitlines() if row.startswith("| ")}
    assert set(GLOSSARY) <= defined


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(doc):
    assert link_problems(doc, doc.read_text()) == []


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading, with punctuation!\n\n## Again\n\n## Again\n")
    page = tmp_path / "page.md"
    text = (
        "[fine](other.md) [fine](other.md#a-code-heading-with-punctuation) [fine](other.md#again-1)\n"
        "[gone](missing.md) [no anchor](other.md#nowhere) [self](#page) [web](https://example.com/x#y)\n"
        "`[not a link](missing-in-code.md)`\n\n```md\n[in a block](missing-in-block.md)\n```\n# Page\n"
    )
    assert link_problems(page, text) == [
        "page.md:2: missing.md: no such file",
        "page.md:2: other.md#nowhere: no such anchor",
    ]


def test_no_paragraph_in_the_docs_runs_over_eight_lines():
    long = [
        f"{doc.relative_to(REPO)}:{first} ({count} lines)"
        for doc in DOCS
        for first, count in paragraphs(doc.read_text())
        if count > PARAGRAPH_LINES
    ]
    assert long == []
    assert paragraphs("one\ntwo\n\n- a\n  b\n- c\n\n```\nx\n```\n| t |\n") == [(1, 2), (4, 2), (6, 1)]


def test_every_script_the_quick_start_names_exists_and_is_executable():
    quick_start = section(README.read_text(), "Quick start")
    scripts = set(re.findall(r"(?<![\w/.-])scripts/[\w.-]+\.sh\b", quick_start))
    assert {"scripts/compose-up.sh", "scripts/test.sh"} <= scripts  # the two commands users and CI run
    for script in sorted(scripts):
        path = REPO / script
        assert path.is_file(), f"{script} is named in the quick start but does not exist"
        assert os.access(path, os.X_OK), f"{script} is not executable"


def test_the_words_users_read_are_the_fields():
    """No "door", "room", "lifeline", "test hosts" or "offline path" in the README, docs/, .env.example or --help."""
    readable = {str(doc.relative_to(REPO)): doc.read_text() for doc in [*DOCS, REPO / ".env.example"]}
    readable |= help_texts()
    found = [f"{where}: {match.group(0)!r}" for where, text in readable.items() for match in SHORTHAND.finditer(text)]
    assert found == []
    assert SHORTHAND.findall("both doors, two rooms, its lifeline, the test hosts, the offline path") != []


CODE_FOLDERS = ("app", "launcher", "docker", "scripts")
"""Read whole: what users run and read (Python: its strings and comments; every other file: every line)."""
READ_WHOLE = ("compose*.yaml", "Dockerfile", ".env.example", "README.md", "docs/*.md")
NAMED_IN_CODE = re.compile(r"`\w+`")
"""A backticked name in a docstring (`door`, `DOORS`): the code's identifier, not a word users read."""


def strings_and_comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and string literal of Python source: docstrings, messages, an f-string's text
    (not its expressions); a string over several lines one entry per line."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.extend((node.lineno + offset, line) for offset, line in enumerate(node.value.splitlines()))
    return sorted(found)


def user_facing_files() -> list[Path]:
    files = [
        path
        for folder in CODE_FOLDERS
        for path in sorted((REPO / folder).rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]
    return files + [path for pattern in READ_WHOLE for path in sorted(REPO.glob(pattern))]


def shorthand_problems(path: Path, text: str) -> list[str]:
    """`file:line: 'word'` for every FIELD_WORDS word in the file's user-facing text."""
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    lines = strings_and_comments(text) if path.suffix == ".py" else enumerate(text.splitlines(), 1)
    return [
        f"{where}:{number}: {match.group(0)!r}"
        for number, line in lines
        for match in CODE_SHORTHAND.finditer(NAMED_IN_CODE.sub("", line))
    ]


def test_no_shorthand_in_what_the_code_shows():
    """No "door", "room" or "lifeline" in the code's strings and comments (app/, launcher/, docker/, scripts/: log
    lines, errors, process names, --help, docstrings), compose's files, the Dockerfile, .env.example or the docs."""
    found = [
        problem
        for path in user_facing_files()
        for problem in shorthand_problems(path, path.read_text(errors="replace"))
    ]
    assert found == []
    # The walk reaches the files that once held such words (launcher/ only where this checkout has it: the launcher's
    # install test runs these tests against the installed package, its source folder removed).
    expected = {"docker/entrypoint.sh", "docker/sshd_config", "compose.yaml", "Dockerfile", "docs/compose.md"}
    if (REPO / "launcher").is_dir():
        expected.add("launcher/core/protocol.py")
    assert {str(path.relative_to(REPO)) for path in user_facing_files()} >= expected


def test_shorthand_in_a_string_or_comment_is_found_and_a_name_is_not(tmp_path):
    source = (
        'DOORS = ("launcher", "compose")  # the doors\n'
        'message = f"{self.door!r} closed: the lifeline"\n'
        "def lifeline(door):\n"
        '    """Holds the room open; `door` and `DOORS` are names."""\n'
    )
    assert shorthand_problems(tmp_path / "code.py", source) == [
        "code.py:1: 'doors'",
        "code.py:2: 'lifeline'",
        "code.py:4: 'room'",
    ]
    assert shorthand_problems(tmp_path / "sshd_config", "# the agent's lifeline\nUsePAM no\n") == [
        "sshd_config:1: 'lifeline'"
    ]


UNBREAKABLE = re.compile(r"(?:[-*]\s+)?(?:<?https?://\S+?>?|\[[^\]\s]*\]\(\S+\))[.,;:]?")
"""A prose line that is one URL or one link alone, which no wrapping shortens."""


def wide_prose(text: str) -> list[int]:
    """The prose lines over DOCS_WIDTH characters: not a fenced code block's, a table row or a lone link."""
    wide, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or len(line) <= DOCS_WIDTH or line.lstrip().startswith("|"):
            continue
        elif not UNBREAKABLE.fullmatch(line.strip()):
            wide.append(number)
    return wide


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_the_docs_prose_wraps_at_120_characters(doc):
    assert [f"{doc.relative_to(REPO)}:{number}" for number in wide_prose(doc.read_text())] == []


def test_only_prose_has_to_wrap():
    long = "word " * 30
    text = f"{long}\n```sh\n{long}\n```\n| {long} |\n- https://example.com/{'x' * 130}\n[{long}]({'y' * 10})\n"
    assert wide_prose(text) == [1, 7]


# --- a host the set-up does not serve -------------------------------------------------------------------------
SCRIPTS = REPO / "scripts"
DOCKER_INSTALL_URL = "https://docs.docker.com/engine/install/"
OS_RELEASES = {
    "ubuntu-24.04": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n',
    "debian-13": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian GNU/Linux"\nVERSION_ID="13"\nID=debian\n',
    "debian-12": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n',
}
# What the engine set-up would run to install, unpack or start anything: each stands in, records its call and fails.
SET_UP_COMMANDS = ("apt-get", "apt", "dpkg", "dpkg-deb", "dockerd", "containerd", "setsid", "debootstrap")


def stand_in_host(tmp_path: Path, os_release: str | None, uid: int) -> tuple[dict[str, str], Path]:
    """An environment whose host is the given os-release (None: no such file) and user id, with no Docker engine
    answering; the commands that install or start anything only record that they were called. No root needed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    real_id = shutil.which("id")
    stand_ins = {
        "docker": f'echo "docker $*" >> {calls}\n'
        "echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?' >&2\n"
        "exit 1\n",
        "id": f'if [ "$1" = -u ]; then echo {uid}; else exec {real_id} "$@"; fi\n',
        **{command: f'echo "{command} $*" >> {calls}\nexit 1\n' for command in SET_UP_COMMANDS},
    }
    for name, body in stand_ins.items():
        script = bin_dir / name
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)
    release = tmp_path / "os-release"
    if os_release is not None:
        release.write_text(os_release)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOROVOD_STACK_OS_RELEASE": str(release),
        "ENGINE_ROOT": str(tmp_path / "engine"),
    }
    return env, calls


def recorded(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    "host, uid, expected",
    [
        ("ubuntu-24.04", 0, "this host is Ubuntu 24.04.1 LTS, and scripts/host-setup.sh sets up Debian 12 only"),
        ("debian-13", 0, "this host is Debian GNU/Linux 13 (trixie), and scripts/host-setup.sh sets up Debian 12 only"),
        (None, 0, "this host is a system without "),
        ("debian-12", 1000, "scripts/host-setup.sh sets up this Debian 12 host only as root"),
        ("debian-12", 0, ""),
    ],
)
def test_the_set_up_names_a_host_it_does_not_serve(tmp_path, host, uid, expected):
    env, calls = stand_in_host(tmp_path, OS_RELEASES.get(host or ""), uid)
    result = subprocess.run(
        [SCRIPTS / "host-setup.sh", "host-problem"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(expected) and bool(result.stdout.strip()) == bool(expected), result.stdout
    assert recorded(calls) == []


@pytest.mark.parametrize("host, uid", [("ubuntu-24.04", 0), ("debian-13", 0), ("debian-12", 1000)])
def test_the_first_command_on_a_host_it_does_not_serve_ends_at_once_in_one_line(tmp_path, host, uid):
    """`scripts/compose-up.sh` as root on Ubuntu (or Debian 13, or as a user on Debian 12) with no engine answering:
    one line naming the problem and Docker Engine's install page, exit 1, nothing installed, unpacked or started."""
    env, calls = stand_in_host(tmp_path, OS_RELEASES[host], uid)
    result = subprocess.run([SCRIPTS / "compose-up.sh"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("build-images: no Docker engine to build with (docker info: Cannot connect"), lines[0]
    assert "install Docker Engine with Compose 2.17 or newer and buildx" in lines[0]
    assert DOCKER_INSTALL_URL in lines[0]
    assert recorded(calls) == ["docker info -f {{.ServerVersion}}"]  # asked, and nothing else run
    assert not (tmp_path / "engine").exists() and not (tmp_path / "engine.partial").exists()


def test_the_set_up_itself_refuses_a_host_it_does_not_serve(tmp_path):
    env, calls = stand_in_host(tmp_path, OS_RELEASES["ubuntu-24.04"], 0)
    for mode in ("engine", "packages", "all"):
        result = subprocess.run([SCRIPTS / "host-setup.sh", mode], capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 1
        assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
        assert "Ubuntu 24.04.1 LTS" in result.stderr and DOCKER_INSTALL_URL in result.stderr
    assert recorded(calls) == []


def test_on_the_host_it_serves_the_same_stand_ins_reach_the_engine_set_up(tmp_path):
    """The control: Debian 12, root, the same stand-ins and no engine, and the build goes on to set one up (its dry
    run says so), so the refusals above come from the host check, not from the stand-ins."""
    env, calls = stand_in_host(tmp_path, OS_RELEASES["debian-12"], 0)
    result = subprocess.run(
        [SCRIPTS / "build-images.sh", "--dry-run"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "would set up the engine (scripts/host-setup.sh engine)" in result.stdout
    assert recorded(calls) == ["docker info -f {{.ServerVersion}}"]
