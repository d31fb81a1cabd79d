"""``snowfence completion``: shell completion scripts made from the command line's own parser."""

from __future__ import annotations

import argparse
import sys


def completion_bash(parser: argparse.ArgumentParser) -> str:
    """A bash completion script for ``parser``: its commands, and each command's flags."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    top = [o for a in parser._actions for o in a.option_strings]
    cases = []
    for name, command in commands.items():
        flags = sorted({o for a in command._actions for o in a.option_strings})
        cases.append(f'        {name}) opts="{" ".join(flags)}" ;;')
    return "\n".join(
        [
            "# bash completion for snowfence, made by `snowfence completion bash`",
            "_snowfence() {",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" cmd="" opts i',
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac',
            "    done",
            '    case "$cmd" in',
            f'        "") opts="{" ".join([*commands, *top])}" ;;',
            *cases,
            '        *) opts="" ;;',
            "    esac",
            '    COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
            "}",
            "complete -o default -F _snowfence snowfence",
            "",
        ]
    )


def _commands_and_flags(parser: argparse.ArgumentParser):
    """(top-level flags, {command: (its one-line help, its flags)}) of ``parser``, as the scripts list them."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    top = [o for a in parser._actions for o in a.option_strings]
    commands = {
        name: (helps.get(name, ""), sorted({o for a in command._actions for o in a.option_strings}))
        for name, command in sub.choices.items()
    }
    return top, commands


def completion_zsh(parser: argparse.ArgumentParser) -> str:
    """A zsh completion script for ``parser``: its commands, each command's flags, files for the rest. Works
    eval'd (after compinit) and as an autoloaded ``_snowfence`` in ``$fpath``."""
    top, commands = _commands_and_flags(parser)
    cases = [f"        {name}) opts=({' '.join(flags)}) ;;" for name, (_, flags) in commands.items()]
    return "\n".join(
        [
            "#compdef snowfence",
            "# zsh completion for snowfence, made by `snowfence completion zsh`",
            "_snowfence() {",
            '    local cmd="" i',
            "    local -a opts",
            "    for ((i = 2; i < CURRENT; i++)); do",
            '        case "${words[i]}" in -*) ;; *) cmd="${words[i]}"; break ;; esac',
            "    done",
            '    case "$cmd" in',
            f'        "") opts=({" ".join([*commands, *top])}) ;;',
            *cases,
            "        *) opts=() ;;",
            "    esac",
            '    if [[ -z "$cmd" || "${words[CURRENT]}" == -* ]]; then',
            '        compadd -- "${opts[@]}"',
            "    else",
            "        _files",
            "    fi",
            "}",
            'if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then',
            '    _snowfence "$@"',
            "else",
            "    compdef _snowfence snowfence",
            "fi",
            "",
        ]
    )


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def completion_fish(parser: argparse.ArgumentParser) -> str:
    """A fish completion script for ``parser``: each command (with its help), and each command's flags."""
    top, commands = _commands_and_flags(parser)
    lines = ["# fish completion for snowfence, made by `snowfence completion fish`", "complete -c snowfence -e"]

    def flag(option: str) -> str:
        return f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"

    for option in top:
        lines.append(f"complete -c snowfence -n __fish_use_subcommand {flag(option)}")
    for name, (text, flags) in commands.items():
        described = f" -d {_fish_quote(text.rstrip('.'))}" if text else ""
        lines.append(f"complete -c snowfence -n __fish_use_subcommand -f -a {name}{described}")
        seen = _fish_quote(f"__fish_seen_subcommand_from {name}")
        lines.extend(f"complete -c snowfence -n {seen} {flag(option)}" for option in flags)
    return "\n".join(lines) + "\n"


COMPLETIONS = {"bash": completion_bash, "zsh": completion_zsh, "fish": completion_fish}


def add(sub) -> None:
    completion = sub.add_parser(
        "completion",
        help='Print a shell completion script for every command and flag: eval "$(snowfence completion bash)".',
        description="Prints a completion script made from this command line's own parser, so it lists every "
        'command and flag of this version. Bash: add `eval "$(snowfence completion bash)"` to ~/.bashrc. Zsh: '
        'add `eval "$(snowfence completion zsh)"` to ~/.zshrc after compinit (or save it as _snowfence in a '
        "directory of $fpath). Fish: `snowfence completion fish > ~/.config/fish/completions/snowfence.fish`.",
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"], help="The shell to complete in.")
    completion.set_defaults(run=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(COMPLETIONS[args.shell](args.parser))
    return 0
