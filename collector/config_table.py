"""The collector's settings as a markdown table, built from ``config.CollectorConfig`` itself.

Each row is one field: its name (and ``init()`` argument), environment variable, default, what
its variable accepts, and the docstring written right under the field (read from the source, as
attribute docstrings are not kept at run time). docs/configuration.md holds the output; a test
checks that it still matches::

    python -m bubblescope.collector.config_table

A separate module (not ``config`` itself) so that ``python -m`` runs it without the package
having imported it first.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from dataclasses import Field, fields

from bubblescope.collector import config


def field_docs(cls: type = config.CollectorConfig) -> dict[str, str]:
    """Each field's docstring (the string right under its annotated assignment), on one line."""
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    body = next(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == cls.__name__).body
    docs: dict[str, str] = {}
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(item: Field[object], doc: str) -> str:
    name = f"`{item.name}`"
    if item.metadata["init"]:
        name += f" (`init({item.metadata['init']}=)`)"
    parser: config.Parser = item.metadata["parser"]
    default = item.metadata["shown"] or f"`{item.default}`"
    cells = (name, f"`{item.metadata['env']}`", default, parser.accepts, doc)
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def config_table() -> str:
    """The markdown table of every setting, in the order the fields are declared."""
    docs = field_docs()
    rows = [
        "| setting | environment variable | default | accepts | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for item in fields(config.CollectorConfig):
        if item.name not in docs:
            raise ValueError(f"CollectorConfig.{item.name} has no docstring under it")
        rows.append(_row(item, docs[item.name]))
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(config_table(), end="")
