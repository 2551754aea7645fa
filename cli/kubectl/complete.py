"""Shell completion for ``kubectl gpushare``: what to offer for a partly typed command line.

kubectl (1.26+) completes a plugin's arguments by running ``kubectl_complete-<plugin>`` from
``PATH`` with the words typed after the plugin's name, the last one being the word under the
cursor ("" when the cursor follows a space): ``kubectl gpushare who -n de<TAB>`` runs
``kubectl_complete-gpushare who -n de``. The executable prints one candidate per line, each
optionally followed by a tab and a description, and ends with ``:<directive>``, the bit set of
cobra's ShellCompDirective that tells the shell what to do besides (``:4``: no file names).
kubectl shows the executable's stderr on the terminal, so nothing is written there.

The command structure (subcommands, which flags take a value) is read from the typer app, so
completion cannot drift from the flags; the names of nodes, pods, namespaces and contexts come
from a ``Names`` lookup the caller passes in (the API; here only its interface). Everything
below is a plain function of the words and the lookup.

``bash_script`` is the same completion for ``kubectl-gpushare`` typed directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# cobra's ShellCompDirective bits (spf13/cobra completions.go).
DIRECTIVE_DEFAULT = 0  # no directive: the shell may complete file names when nothing is offered
DIRECTIVE_ERROR = 1
DIRECTIVE_NO_SPACE = 2
DIRECTIVE_NO_FILE_COMP = 4

OUTPUT_VALUES = (("wide", "more columns"), ("json", "the same data as JSON"), ("yaml", "the same data as YAML"))
SHELLS = (("bash", "a bash completion script for kubectl-gpushare"),)


class Names(Protocol):
    """Where completion finds the names of things; each answers [] when it cannot tell."""

    def nodes(self) -> list[str]: ...

    def pods(self, namespace: str | None) -> list[str]: ...  # None: every namespace, as NS/NAME

    def namespaces(self) -> list[str]: ...

    def contexts(self) -> list[str]: ...


@dataclass(frozen=True)
class Option:
    name: str  # the parameter's name in the command function ("all_namespaces")
    flags: tuple[str, ...]  # "-A", "--all-namespaces"
    takes_value: bool
    help: str = ""


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    options: tuple[Option, ...]
    argument: str = ""  # the positional parameter's name; "" when the command takes none

    def option(self, flag: str) -> Option | None:
        return next((o for o in self.options if flag in o.flags), None)


@dataclass(frozen=True)
class Tree:
    """The plugin as completion sees it: the root's own flags and each subcommand."""

    root: Command
    commands: Mapping[str, Command]


@dataclass
class Request:
    """What the cursor is on, and what the words before it said."""

    kind: str  # "command", "flag", "value" (of ``option``), "argument" (of ``command``) or "" (nothing)
    command: Command | None
    incomplete: str
    option: Option | None = None
    values: dict[str, Any] = field(default_factory=dict)  # option name -> its value so far (True for a flag)
    prefix: str = ""  # put before each value: "-n" when completing "-nkube-sys" (the shell's word is all of it)


def _first_line(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n", 1)[0].split())


def tree_of(group: Any) -> Tree:
    """The completion tree of a click group (``typer.main.get_command(app)``): public click attributes only."""

    help_flags = tuple(str(f) for f in (group.context_settings or {}).get("help_option_names") or ("--help",))

    def command(name: str, cmd: Any) -> Command:
        options, argument = [], ""
        for p in cmd.params:
            if getattr(p, "param_type_name", "") == "argument":
                argument = argument or str(p.name)
            else:
                flags = tuple(str(o) for o in (*p.opts, *p.secondary_opts))
                options.append(Option(str(p.name), flags, not p.is_flag, _first_line(p.help)))
        options.append(Option("help", help_flags, False, "show the help and exit"))
        return Command(name, _first_line(cmd.short_help or cmd.help), tuple(options), argument)

    commands = {n: command(n, c) for n, c in sorted(group.commands.items()) if not getattr(c, "hidden", False)}
    return Tree(command("", group), commands)


def resolve(words: Sequence[str], tree: Tree) -> Request:
    """Read the words typed before the cursor (``words[:-1]``) and the one under it (``words[-1]``)."""
    *done, incomplete = list(words) or [""]
    command: Command | None = None
    values: dict[str, Any] = {}
    pending: Option | None = None
    positional = 0
    dashdash = False
    for word in done:
        current = command or tree.root
        if pending is not None:
            values[pending.name], pending = word, None
        elif word == "--" and not dashdash:
            dashdash = True
        elif word.startswith("-") and len(word) > 1 and not dashdash:
            option, value = split_flag(word, current)
            if option is None:
                continue  # a flag this command does not have: the command itself will say so
            if not option.takes_value:
                values[option.name] = True
            elif value is None:
                pending = option
            else:
                values[option.name] = value
        elif command is None:
            command = tree.commands.get(word)
            if command is None:
                return Request("", None, incomplete, values=values)
        else:
            positional += 1
    current = command or tree.root
    if pending is not None:
        return Request("value", command, incomplete, pending, values)
    if incomplete.startswith("-") and not dashdash:
        option, value = split_flag(incomplete, current)
        if option is not None and option.takes_value and value is not None:
            attached = not incomplete.startswith("--") and incomplete[2:3] != "="
            return Request("value", command, value, option, values, incomplete[:2] if attached else "")
        return Request("flag", command, incomplete, values=values)
    if command is None:
        return Request("command", None, incomplete, values=values)
    if positional == 0 and command.argument:
        return Request("argument", command, incomplete, values=values)
    return Request("", command, incomplete, values=values)


def split_flag(word: str, command: Command) -> tuple[Option | None, str | None]:
    """The option a flag word names, and the value it carries itself (``--namespace=x``, ``-nx``, ``-n=x``)."""
    if word.startswith("--"):
        name, eq, value = word.partition("=")
        return command.option(name), (value if eq else None)
    option = command.option(word[:2])
    if option is None or len(word) == 2:
        return option, None
    if not option.takes_value:
        return None, None  # "-Ax": several boolean letters at once, which this plugin does not take
    return option, word[2:].removeprefix("=")


def _pick(values: Iterable[str | tuple[str, str]], incomplete: str) -> list[tuple[str, str]]:
    out = []
    for v in values:
        value, help_ = (v, "") if isinstance(v, str) else v
        if value.startswith(incomplete):
            out.append((value, help_))
    return out


def _namespace(values: Mapping[str, Any]) -> str | None:
    """The namespace pods are completed in: -A means all (None); else -n, else the lookup's default ("")."""
    if values.get("all_namespaces"):
        return None
    return str(values.get("namespace") or "")


def candidates(req: Request, tree: Tree, names: Names) -> tuple[list[tuple[str, str]], int]:
    """The (value, description) pairs to offer, and the directive for the shell."""
    none = DIRECTIVE_NO_FILE_COMP
    if req.kind == "command":
        return _pick(((c.name, c.help) for c in tree.commands.values()), req.incomplete), none
    if req.kind == "flag":
        current = req.command or tree.root
        flags = [(f, o.help) for o in current.options for f in o.flags if f.startswith("--")]
        flags += [(f, o.help) for o in current.options for f in o.flags if not f.startswith("--")]
        return _pick(flags, req.incomplete), none
    if req.kind == "value" and req.option is not None:
        name = req.option.name
        if name == "kubeconfig":
            return [], DIRECTIVE_DEFAULT  # a file: the shell completes file names
        if name == "output":
            return _pick(OUTPUT_VALUES, req.incomplete), none
        if name in ("namespace", "agent_namespace"):
            return _pick(names.namespaces(), req.incomplete), none
        if name == "context":
            return _pick(names.contexts(), req.incomplete), none
        return [], none
    if req.kind == "argument" and req.command is not None:
        if req.command.name == "status":
            return _pick(names.nodes(), req.incomplete), none
        if req.command.name in ("who", "why"):
            return _pick(names.pods(_namespace(req.values)), req.incomplete), none
        if req.command.name == "completion":
            return _pick(SHELLS, req.incomplete), none
    return [], none


def cobra_lines(found: Sequence[tuple[str, str]], directive: int) -> list[str]:
    """cobra's ``__complete`` output: ``value[TAB description]`` lines, then ``:directive``."""
    lines = [f"{value}\t{help_}" if help_ else value for value, help_ in found]
    return [*lines, f":{directive}"]


def complete(words: Sequence[str], tree: Tree, names: Names) -> list[str]:
    """The lines ``kubectl_complete-gpushare WORDS...`` prints."""
    req = resolve(words, tree)
    found, directive = candidates(req, tree, names)
    return cobra_lines([(req.prefix + v, h) for v, h in found], directive)


# For `kubectl-gpushare` typed directly (kubectl's own completion covers `kubectl gpushare`): the
# same protocol, so the same executable answers. The line up to the cursor is split on blanks
# rather than taken from COMP_WORDS, which bash also splits at '=' and ':'.
BASH_SCRIPT = r"""# bash completion for kubectl-gpushare; load it with: source <(kubectl-gpushare completion bash)
_kubectl_gpushare() {
    local line=${COMP_LINE:0:COMP_POINT} cur="" out directive c
    local -a words comps=()
    read -r -a words <<< "$line"
    if [[ $line != *[[:space:]] ]]; then
        cur=${words[${#words[@]}-1]}
        unset 'words[${#words[@]}-1]'
    fi
    out=$(kubectl_complete-gpushare "${words[@]:1}" "$cur" 2>/dev/null) || return 0
    directive=${out##*$'\n'}
    directive=${directive#:}
    [[ $directive =~ ^[0-9]+$ ]] || directive=0
    (( directive & 1 )) && return 0
    while IFS= read -r c; do
        [[ -n $c && $c != :* ]] && comps+=("${c%%$'\t'*}")
    done <<< "$out"
    [[ $cur == -*=* ]] && cur=${cur#*=}
    COMPREPLY=()
    for c in "${comps[@]}"; do
        [[ $c == "$cur"* ]] && COMPREPLY+=("$c")
    done
    if (( ${#COMPREPLY[@]} == 0 && (directive & 4) == 0 )); then
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    fi
    (( directive & 2 )) && compopt -o nospace
    return 0
}
complete -F _kubectl_gpushare kubectl-gpushare
"""


def script(shell: str) -> str:
    if shell != "bash":
        raise ValueError(
            f"{shell!r}: only bash; zsh and fish complete `kubectl gpushare` through kubectl's own completion"
        )
    return BASH_SCRIPT


__all__ = [
    "DIRECTIVE_DEFAULT",
    "DIRECTIVE_ERROR",
    "DIRECTIVE_NO_FILE_COMP",
    "DIRECTIVE_NO_SPACE",
    "Command",
    "Names",
    "Option",
    "Request",
    "Tree",
    "candidates",
    "cobra_lines",
    "complete",
    "resolve",
    "script",
    "tree_of",
]
