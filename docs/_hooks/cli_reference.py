"""MkDocs hook: the command-line reference, generated from the Typer app.

A page holding the line ``<!-- cli-reference -->`` gets, in its place, every ``isotrope`` command with
its help text, usage and a table of its arguments and options, read from the app's click command
(so a new option is documented the moment it exists).
"""

from __future__ import annotations

import types
import typing
from typing import Any

PLACEHOLDER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the placeholder with the generated reference (other pages pass through)."""
    if PLACEHOLDER not in markdown:
        return markdown
    return markdown.replace(PLACEHOLDER, cli_markdown())


def cli_markdown() -> str:
    """Markdown for the global options and every command of ``isotrope``."""
    import typer

    from isotrope.cli import app

    group = typer.main.get_command(app)
    parts = ["## Global options", "", "`isotrope [GLOBAL OPTIONS] COMMAND ...`", "", _params_table(group)]
    commands = group.commands  # type: ignore[attr-defined]
    for name, command in commands.items():
        parts += ["", f"## `isotrope {name}`", "", _escape(command.help or "").strip(), ""]
        arguments = [param.name.upper() for param in command.params if param.param_type_name == "argument"]
        parts += [f"`isotrope {name} [OPTIONS] {' '.join(arguments)}`", "", _params_table(command)]
    return "\n".join(parts) + "\n"


def _annotations(command: Any) -> dict[str, Any]:
    """The type hints of the function behind a click command (typer wraps it, keeping ``__wrapped__``)."""
    function = getattr(command.callback, "__wrapped__", command.callback)
    return typing.get_type_hints(function) if function is not None else {}


def _params_table(command: Any) -> str:
    annotations = _annotations(command)
    rows = ["| argument or option | type | default | description |", "|---|---|---|---|"]
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        names = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
        if param.param_type_name == "argument":
            names = f"`{param.name.upper()}`" + (" (required)" if param.required else "")
        annotation = annotations.get(param.name, getattr(param.type, "name", "text"))
        kind = "flag" if getattr(param, "is_flag", False) else _type_name(annotation)
        default = "" if param.required or param.default is None else f"`{param.default}`"
        if getattr(param, "multiple", False) or param.nargs == -1:
            kind += ", repeatable"
        description = _escape(getattr(param, "help", "") or "")
        if param.envvar:
            description += f" (environment: `{param.envvar}`)"
        rows.append(f"| {names} | {kind} | {default} | {description} |")
    return "\n".join(rows)


def _type_name(annotation: Any) -> str:
    """``str | None`` -> ``str``; ``list[Path]`` -> ``list[Path]``; a class -> its name."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _type_name(args[0])
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "").replace("pathlib.", "")


def _escape(text: str) -> str:
    """Text safe in a Markdown table cell and outside code: pipes and angle brackets escaped."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")
