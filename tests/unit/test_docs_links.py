"""The repository stands alone: no file points outside it, and the docs name only paths that exist.

A clone must make sense on its own, so no file may cite a document kept outside the repository
or a tracker issue by number: say what the thing is instead, or name the upstream source. And a
path the docs quote in backticks (``controller/loop.py``, ``tests/fixtures/metrics/``) must
still be there, so a move or a rename cannot leave the docs pointing at nothing.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from gpushare import keys

ROOT = Path(__file__).resolve().parents[2]

# Pieces are joined so that this file does not match its own patterns.
_OUTSIDE_DOCS = ("..", "/shared"), ("shared", "/docs")
FORBIDDEN = [re.compile(re.escape(a + b)) for a, b in _OUTSIDE_DOCS] + [
    re.compile(r"(?i)\bissue [0-9]+"),  # a tracker issue by number
    re.compile(r"(?i)[(]issue"),  # an issue cited in parentheses, with or without its number
]
# The exporter pages there are data in the vendors' formats, not prose of ours.
SKIPPED_DIRS = ("tests/fixtures/",)

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_PATHLIKE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.*-]*)*$")


def _git(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], input=stdin, capture_output=True, text=True, check=False, timeout=60
    )


def repo_files() -> list[str]:
    """Every file of the repository: tracked, or new and not ignored; deleted ones left out."""
    out = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    assert out.returncode == 0, f"git ls-files failed: {out.stderr.strip()}"
    return sorted({f for f in out.stdout.split("\0") if f and (ROOT / f).is_file()})


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def forbidden_mentions(rel: str, text: str) -> list[str]:
    return [
        f"{rel}:{n}: {line.strip()[:120]}"
        for n, line in enumerate(text.splitlines(), 1)
        if any(p.search(line) for p in FORBIDDEN)
    ]


def test_no_file_points_outside_the_repository() -> None:
    found: list[str] = []
    for rel in repo_files():
        if rel.startswith(SKIPPED_DIRS):
            continue
        text = text_of(ROOT / rel)
        if text is not None:
            found.extend(forbidden_mentions(rel, text))
    assert not found, "files cite documents outside the repository or tracker issues:\n" + "\n".join(found)


def inline_code(markdown: str) -> Iterable[tuple[int, str]]:
    """(line number, text) of every inline code span outside fenced blocks."""
    in_fence = False
    for n, line in enumerate(markdown.splitlines(), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            for m in _INLINE_CODE.finditer(line):
                yield n, m.group(1).strip()


def quoted_path(span: str, top_level: set[str]) -> str | None:
    """The repository path a code span names, or None when it is something else.

    A path starts with a top-level entry of the repository and has at least one ``/``
    (``tests/unit/...`` counts as ``tests/unit``). ``gpushare/<name>`` without a file suffix
    or trailing slash is a resource name (design §2), not the package.
    """
    path = span.removesuffix("...")
    if "/" not in path or not _PATHLIKE.match(path):
        return None
    if path.split("/", 1)[0] not in top_level:
        return None
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if path.startswith(keys.RESOURCE_PREFIX) and not path.endswith("/") and "." not in last:
        return None
    return path.rstrip("/")


def path_exists(path: str, files: list[str], dirs: set[str]) -> bool:
    if "*" in path:
        return any(fnmatch.fnmatchcase(f, path) for f in files)
    return path in dirs or path in files


def ignored(paths: list[str]) -> set[str]:
    """The paths git ignores: build outputs the docs may name, absent from a fresh clone."""
    if not paths:
        return set()
    out = _git("check-ignore", "--no-index", "--stdin", stdin="\n".join(paths) + "\n")
    return set(out.stdout.splitlines())


def docs_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def missing_paths(pages: Iterable[tuple[str, str]], files: list[str]) -> list[str]:
    """``name:line: `path``` for each quoted path of each (name, markdown) page that does not exist."""
    dirs = {p.as_posix() for f in files for p in Path(f).parents if str(p) != "."}
    top_level = {f.split("/", 1)[0] for f in files}
    misses: list[tuple[str, str]] = []
    for name, markdown in pages:
        for n, span in inline_code(markdown):
            path = quoted_path(span, top_level)
            if path is not None and not path_exists(path, files, dirs):
                misses.append((f"{name}:{n}", path))
    skip = ignored(sorted({p for _, p in misses}))
    return [f"{where}: `{path}`" for where, path in misses if path not in skip]


def test_there_are_docs_to_check() -> None:
    assert (ROOT / "README.md").is_file() and len(docs_pages()) > 5


def test_paths_quoted_in_the_docs_exist() -> None:
    pages = [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in docs_pages()]
    missing = missing_paths(pages, repo_files())
    assert not missing, "docs quote paths that do not exist:\n" + "\n".join(missing)


def test_the_checks_catch_what_they_are_for() -> None:
    # Both checks above pass vacuously if their patterns rot; prove each one still bites.
    bad_lines = [
        "see " + "../" + "shared/notes.md",
        "as in " + "shared" + "/docs/design.md",
        "fixed in " + "Issue" + " 12",
        "spot return " + "(" + "issue #3)",
    ]
    for line in bad_lines:
        assert forbidden_mentions("x.py", line), line
    assert not forbidden_mentions("x.py", "an issue with 2 GPUs; kubernetes/kubernetes#118534")

    page = (
        "Read `controller/no_such_module.py`, `tests/unit/...` and `tests/fixtures/metrics/*.prom`;\n"
        "`docs/`, resource `gpushare/share-gpu-4`, `nvidia.com/gpu`, `/tmp/gs-x/a.py`, `make test`.\n"
        "```\ncontroller/also_missing.py `controller/missing_in_a_fence.py`\n```\n"
        "And `tests/fixtures/metrics/*.nothing`.\n"
    )
    assert missing_paths([("page.md", page)], repo_files()) == [
        "page.md:1: `controller/no_such_module.py`",
        "page.md:6: `tests/fixtures/metrics/*.nothing`",
    ]
