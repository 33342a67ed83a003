"""User-supplied text (a model URI, an arm's description, an init path, shard names, flow overrides) as Markdown that
shows it and nothing else, in every renderer the reports reach: MkDocs (the docs site), MLflow's model descriptions
and Prefect's artifacts. Raw HTML there runs script in the docs site, and an ``<img>`` or ``![](…)`` makes a browser
fetch an address of the writer's choosing, even where the UI strips script."""

from __future__ import annotations

import html
import re

# Markdown's backslash-escapable punctuation (CommonMark's set covers Python-Markdown's, tables' '|' included)
_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def md_text(value: object) -> str:
    """``value`` as plain Markdown text: HTML escaped, Markdown punctuation backslash-escaped (no link, image, code span
    or table cell can start inside it), line breaks as spaces (a table row stays one line)."""
    text = " ".join(str(value).split())
    return _PUNCTUATION.sub(r"\\\1", html.escape(text, quote=False))  # no quotes: never inside an attribute


def md_literal(value: object) -> str:
    """``value`` in a code span (shown as typed, HTML inert) when it can be one in every renderer — no backtick, pipe
    or line break; otherwise as :func:`md_text`."""
    text = str(value)
    if text and not any(c in text for c in "`|\r\n") and text == text.strip():
        return f"`{text}`"
    return md_text(text)
