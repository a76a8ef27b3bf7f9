"""`rankwatch completion`: a shell completion script made from the command-line parsers."""

from __future__ import annotations

import argparse
import sys

NAME = "completion"
HELP = "print a shell completion script (bash or zsh)"
SHELLS = ("bash", "zsh")
# Values of options with these metavars are paths; of others, free text (nothing offered).
FILE_METAVARS = {"PATH", "FILE"}
DIR_METAVARS = {"DIR"}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help=HELP,
        description=(
            "Print a completion script for commands, options and their choices. "
            'bash: eval "$(rankwatch completion bash)" in ~/.bashrc; '
            'zsh: eval "$(rankwatch completion zsh)" in ~/.zshrc.'
        ),
    )
    parser.add_argument("shell", choices=SHELLS, help="bash or zsh")
    parser.set_defaults(func=run)
    return parser


def _reply(action: argparse.Action | None) -> str:
    """The bash that fills COMPREPLY for the value of ``action`` (None: no such value); a
    positional argument without choices is a path."""
    if action is None:
        return "COMPREPLY=()"
    if action.choices:
        words = " ".join(str(c) for c in action.choices)
        return f'COMPREPLY=($(compgen -W "{words}" -- "$cur"))'
    metavar = action.metavar if isinstance(action.metavar, str) else None
    if metavar in DIR_METAVARS:
        return 'COMPREPLY=($(compgen -d -- "$cur"))'
    path_type = action.type is not None and "Path" in repr(action.type)
    if metavar in FILE_METAVARS or path_type or not action.option_strings:
        return 'COMPREPLY=($(compgen -f -- "$cur"))'
    return "COMPREPLY=()"  # free text: a port, a URL, a name


def bash_script(parser: argparse.ArgumentParser) -> str:
    from rankwatch.cli.main import subcommands

    commands = subcommands(parser)
    top = [o for a in parser._actions for o in a.option_strings]
    values: list[str] = []  # "cmd:--option) ...": the value after an option
    bodies: list[str] = []  # "cmd) ...": an option or a positional argument
    for name, sub in commands.items():
        options = [o for a in sub._actions for o in a.option_strings]
        for action in sub._actions:
            if action.option_strings and action.nargs != 0:
                pattern = "|".join(f"{name}:{o}" for o in action.option_strings)
                values.append(f"        {pattern}) {_reply(action)}; return ;;")
        positional = next((a for a in sub._actions if not a.option_strings), None)
        bodies.append(
            f"        {name})\n"
            f'            if [[ "$cur" == -* ]]; then\n'
            f'                COMPREPLY=($(compgen -W "{" ".join(options)}" -- "$cur"))\n'
            f"            else\n"
            f"                {_reply(positional)}\n"
            f"            fi ;;"
        )
    lines = [
        "# rankwatch completion for bash (made by `rankwatch completion bash`)",
        "_rankwatch() {",
        "    local cur prev cmd i",
        '    cur="${COMP_WORDS[COMP_CWORD]}"',
        '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    cmd=""',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in',
        f'            {"|".join(commands)}) cmd="${{COMP_WORDS[i]}}"; break ;;',
        "        esac",
        "    done",
        '    case "$cmd:$prev" in',
        *values,
        "    esac",
        '    case "$cmd" in',
        '        "")',
        f'            COMPREPLY=($(compgen -W "{" ".join([*commands, *top])}" -- "$cur")) ;;',
        *bodies,
        "    esac",
        "}",
        "complete -F _rankwatch rankwatch",
        "",
    ]
    return "\n".join(lines)


def zsh_script(parser: argparse.ArgumentParser) -> str:
    # zsh runs bash completion functions through bashcompinit: one script to keep right.
    head = [
        "#compdef rankwatch",
        "# rankwatch completion for zsh (made by `rankwatch completion zsh`)",
        "autoload -U +X compinit && compinit",
        "autoload -U +X bashcompinit && bashcompinit",
    ]
    return "\n".join(head) + "\n" + bash_script(parser).split("\n", 1)[1]


def run(args: argparse.Namespace) -> int:
    from rankwatch.cli.main import build_parser

    parser = build_parser()
    script = bash_script(parser) if args.shell == "bash" else zsh_script(parser)
    sys.stdout.write(script)
    return 0
